# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Each man page's example program prints what its page says it prints.

The harness extracts and builds the examples (scripts/build-guest.sh); hex
numbers of six digits or more are addresses and may differ.
"""
import pathlib
import re
import subprocess

import pytest

EXAMPLES = pathlib.Path("/out/guest/man-examples")
PAGES = sorted(p.stem for p in EXAMPLES.glob("*.expected"))


def masked(text):
    return re.sub(r"0x[0-9a-f]{6,}", "ADDR", text)


def test_examples_were_built():
    assert PAGES, f"no man page examples in {EXAMPLES}"


@pytest.mark.parametrize("page", PAGES)
def test_example_output(page):
    run = subprocess.run([str(EXAMPLES / page)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert masked(run.stdout) == masked((EXAMPLES / f"{page}.expected").read_text())
