# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""libodpwatch-ucx-preload.so's own paths, without UCX or MPI (those are the
middleware suite's rows): ucx-preload-test (libprovider/tests/ucx_preload_test.cpp)
stands in for UCX's ucm_vm_munmap(), registers buffers on rxe0 through the
preload, changes them with raw system calls and checks which ranges the
preload hands over before a UCP call would run."""
import os
import subprocess

import pytest

from conftest import memwatch_max_overlap

BINARY = "/out/guest/bin/ucx-preload-test"
PRELOAD = "/out/guest/lib/libodpwatch-ucx-preload.so"


def run(case, **env):
    p = subprocess.run([BINARY, case], env=dict(os.environ, LD_PRELOAD=PRELOAD, **env),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout


@pytest.mark.parametrize("case", ["unmap", "on-demand", "dereg", "fork"])
def test_preload_hands_over_what_changed(case):
    rc, out = run(case)
    assert rc == 0 and f"ucx-preload-test: {case} ok" in out, out


def test_preload_rescans_after_an_overflow():
    """A queue of one record, three buffers unmapped: every changed range
    from the words, and the overflow counted."""
    rc, out = run("overflow", ODPWATCH_UCX_QUEUE="1")
    assert rc == 0 and "ucx-preload-test: overflow ok" in out, out


def test_preload_hands_over_a_registration_it_could_not_watch():
    """Under vm.memwatch_max_overlap 1 the second registration of a range
    gets no watch: it is handed over at the next call, so it serves one."""
    with memwatch_max_overlap(1):
        rc, out = run("unwatched")
    assert rc == 0 and "ucx-preload-test: unwatched ok" in out, out


def test_the_unmap_case_fails_with_the_preload_off():
    """The control: with ODPWATCH_UCX=0 the preload watches nothing and
    hands nothing over, and the unmap case says so."""
    rc, out = run("unmap", ODPWATCH_UCX="0")
    assert rc == 1 and "after b's unmap, handed over: none" in out, out
