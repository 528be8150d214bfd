#!/usr/bin/env python3
"""Our kernel documentation pages must build without a warning.

    check-rst.py FILE...

They use no Sphinx roles or directives (the kernel's build would resolve
those), so docutils alone parses them as Sphinx would: any message at
warning level or above fails, with its line.
"""
import io
import sys

import docutils.core
import docutils.utils


def check(path):
    err = io.StringIO()
    try:
        docutils.core.publish_doctree(
            open(path, encoding="utf-8").read(), source_path=path,
            settings_overrides={"report_level": docutils.utils.Reporter.WARNING_LEVEL,
                                "halt_level": docutils.utils.Reporter.SEVERE_LEVEL + 1,
                                "warning_stream": err})
    except docutils.utils.SystemMessage as e:
        err.write(str(e))
    return err.getvalue().strip()


def main():
    bad = 0
    for path in sys.argv[1:]:
        msg = check(path)
        if msg:
            print(msg, file=sys.stderr)
            bad += 1
    print(f"{len(sys.argv) - 1 - bad} of {len(sys.argv) - 1} documentation pages without a docutils warning")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
