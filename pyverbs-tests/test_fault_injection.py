# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Allocation-failure sweep of every memwatch and ODP operation a process can
start (libprovider/tests/failnth_sweep.cpp): the 1st, 2nd, ... kernel
allocation of each fails in turn through the task's fail-nth until the
operation gets through; every failure must give a clean errno and leave
nothing behind. Needs a kernel with fault injection (the debug kernel); the
guest's kmemleak scan after the run finds what a failure path leaked."""
import os
import re
import subprocess

import pytest

BINARY = "/out/guest/bin/failnth-sweep"
OPERATIONS = [
    "memwatch_create",
    "mmap of the memwatch state area",
    "MEMWATCH_IOC_ADD",
    "MEMWATCH_IOC_SET_QUEUE",
    "munmap of a watched page",
    "ibv_reg_mr, explicit ODP (1 MiB)",
    "ibv_reg_mr, implicit ODP",
    "ibv_advise_mr PREFETCH_WRITE, explicit ODP (1 MiB)",
    "ibv_advise_mr PREFETCH_WRITE, implicit ODP (child creation)",
]


def fault_injection():
    return os.path.exists("/proc/thread-self/fail-nth")


def test_every_operation_is_swept():
    r = subprocess.run([BINARY, "--list"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == OPERATIONS


@pytest.mark.skipif(not fault_injection(),
                    reason="no /proc/thread-self/fail-nth: kernel without CONFIG_FAULT_INJECTION "
                           "(the debug kernel runs this)")
@pytest.mark.parametrize("operation", OPERATIONS)
def test_allocation_failures(operation):
    r = subprocess.run([BINARY, operation], capture_output=True, text=True, timeout=1200)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"^ok 1 .* # (\d+) allocations failed in turn", r.stdout, re.M)
    assert m, r.stdout
    # An operation that allocates nothing would not test anything.
    assert int(m.group(1)) > 0, r.stdout
