#!/usr/bin/env python3
"""The man page's ERRORS against the code, errno by errno: every errno
mm/memwatch.c returns (and those the kernel returns for it: EINTR from an
interruptible wait, ENFILE/EMFILE from allocating the descriptor, EBADF
from writing to a read-only one) must be listed in memwatch_create(2),
every listed errno must come from somewhere, and every errno the
bad-input selftest expects must be listed.
   check-man-errnos.py REPO"""
import errno
import re
import sys
from pathlib import Path

ERRNOS = set(errno.errorcode.values())


def code_errnos(src):
    got = set(re.findall(r"-(E[A-Z0-9]+)\b", src)) & ERRNOS
    if "wait_event_interruptible" in src:
        got.add("EINTR")  # -ERESTARTSYS reaches user space as EINTR
    if re.search(r"anon_inode_(create_)?getfd|get_unused_fd_flags", src):
        got |= {"EMFILE", "ENFILE"}
    if re.search(r"anon_inode_(create_)?getfd\([^;]*O_RDONLY", src):
        got.add("EBADF")  # write(2) to a read-only file
    return got


def man_errnos(page):
    errors = re.search(r"^\.SH ERRORS\n(.*?)^\.SH ", page, re.S | re.M)
    if not errors:
        return None
    return set(re.findall(r"^\.BR? (E[A-Z0-9]+)\b", errors[1], re.M)) & ERRNOS


def main():
    top = Path(sys.argv[1])
    code = code_errnos((top / "mm/memwatch.c").read_text())
    man = man_errnos((top / "man/man2/memwatch_create.2").read_text())
    if man is None:
        print("memwatch_create.2 has no ERRORS section")
        return 1
    tested = set(re.findall(r"\b(E[A-Z0-9]+)\b",
                            (top / "selftests/memwatch/memwatch_bad_input.c").read_text())) & ERRNOS
    bad = [f"returned by the code, not in the man page: {e}" for e in sorted(code - man)]
    bad += [f"in the man page, returned nowhere: {e}" for e in sorted(man - code)]
    bad += [f"expected by memwatch_bad_input, not in the man page: {e}" for e in sorted(tested - man)]
    for line in bad:
        print(f"memwatch_create.2: {line}")
    if not bad:
        print(f"memwatch_create.2 lists the {len(man)} errnos of the code: {' '.join(sorted(man))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
