# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""A process with ODP MRs (implicit with children, explicit), a pinned MR,
thousands of watches and RDMA traffic faulting on a second thread ends badly:
OOM-killed inside a memory cgroup (the OOM reaper tears its memory down
through the non-blockable invalidation path), SIGKILLed mid-traffic, or
exiting with everything open. Nothing may hang, and another process's ODP
traffic must go on with the right bytes; leaks and splats are the console
scan's and kmemleak's to report."""
import os
import signal
import subprocess
import time

import pytest

from conftest import memory_cgroup

VICTIM = "/out/guest/bin/odpwatch-teardown"


def start(mode, cgroup=None):
    def join():
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    p = subprocess.Popen([VICTIM, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=join)
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        _, err = p.communicate(timeout=60)
        pytest.fail(f"{mode}: not ready ({line!r}); stderr: {err}")
    return p


def bystander(mib):
    return subprocess.Popen([VICTIM, "bystander", str(mib)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finished(p, timeout):
    out, err = p.communicate(timeout=timeout)
    return p.returncode, err


@pytest.fixture
def memcg():
    with memory_cgroup("odpwatch-oom", 192 << 20) as path:
        yield path


def events(cgroup):
    with open(os.path.join(cgroup, "memory.events")) as f:
        return dict(line.split() for line in f)


def test_oom_kill_in_a_memory_cgroup(memcg):
    other = bystander(32)
    victim = start("oom", memcg)
    rc, err = finished(victim, 600)
    assert rc == -signal.SIGKILL, f"exit {rc}; stderr: {err}"
    assert int(events(memcg)["oom_kill"]) >= 1
    rc, err = finished(other, 600)
    assert rc == 0, f"the bystander's traffic: exit {rc}; {err}"


def test_sigkill_mid_traffic():
    other = bystander(32)
    victim = start("traffic")
    time.sleep(2)  # traffic under way, faults in flight
    victim.kill()
    rc, _ = finished(victim, 120)
    assert rc == -signal.SIGKILL
    rc, err = finished(other, 600)
    assert rc == 0, f"the bystander's traffic: exit {rc}; {err}"


def test_exit_with_everything_open():
    victim = start("exit")
    rc, err = finished(victim, 120)
    assert rc == 0, err
    rc, err = finished(bystander(8), 600)
    assert rc == 0, f"traffic after the exit: exit {rc}; {err}"
