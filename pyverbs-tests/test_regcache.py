# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""The registration cache of libodpwatch, end to end on rxe: one pytest test
per case of regcache-test (libprovider/tests/regcache_test.cpp), which moves
real bytes through the cache's registrations with RDMA WRITE."""
import subprocess

import pytest

BINARY = "/out/guest/bin/regcache-test"
CASES = ["reuse-pinned", "reuse-explicit-odp", "reuse-implicit-odp",
         "threads-pinned", "threads-explicit-odp", "threads-implicit-odp",
         "limits", "events", "bad-input"]


@pytest.mark.parametrize("case", CASES)
def test_regcache(case):
    r = subprocess.run([BINARY, case], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"ok 1 {case}" in r.stdout, r.stdout + r.stderr


def test_every_case_runs_here():
    r = subprocess.run([BINARY, "--list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and sorted(r.stdout.split()) == sorted(CASES)
    r = subprocess.run([BINARY, "no-such-case"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not ok 1 no-such-case # no such case" in r.stdout
