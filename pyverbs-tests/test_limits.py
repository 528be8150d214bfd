# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Limits: RLIMIT_MEMLOCK holds pinned MRs and not ODP MRs; watches are
charged to the memory cgroup of the process that adds them, so a cgroup's
limit stops a flood of watches (ENOMEM or the cgroup's OOM killer), long
before the per-descriptor or per-user limits. The per-user, per-descriptor
and queue limits themselves are the memwatch kselftests'."""
import os
import re
import signal
import subprocess

import pytest

from conftest import memory_cgroup

PROBE = "/out/guest/bin/odpwatch-limits"


@pytest.fixture
def memcg():
    with memory_cgroup("odpwatch-limits") as path:
        yield path


def run_in(cgroup, *args, timeout=600):
    def join():
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    return subprocess.run([PROBE, *args], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=join)


def test_memlock_binds_pinned_not_odp():
    p = subprocess.run([PROBE, "memlock"], capture_output=True, text=True, timeout=600)
    print(p.stdout)
    assert p.returncode == 0, p.stderr


def test_watches_are_charged_to_the_memcg(memcg):
    n = 50000
    p = run_in(memcg, "watch-charge", str(n))
    print(p.stdout)
    assert p.returncode == 0, p.stderr
    each = float(re.search(r"each watch: ([\d.]+) bytes", p.stdout).group(1))
    before, with_, after = map(int, re.search(
        r"before (\d+) with (\d+) after (\d+)", p.stdout).groups())
    # A watch is a slab object with an interval-tree node (~100 bytes), its
    # generation word and its share of the xarray; uncharged, this reads ~0.
    assert each >= 64, f"{each} bytes charged per watch"
    # Closing the descriptor gives the charge back (within per-CPU slack).
    assert after - before < (with_ - before) / 4, p.stdout


def test_memcg_limit_stops_a_watch_flood(memcg):
    with open(os.path.join(memcg, "memory.max"), "w") as f:
        f.write(str(24 << 20))
    p = run_in(memcg, "watch-flood")
    print(p.stdout[-400:])
    counts = [int(c) for c in re.findall(r"^(\d+) watches$", p.stdout, re.M)]
    stopped = re.search(r"stopped after (\d+) watches: (.*)", p.stdout)
    with open(os.path.join(memcg, "memory.events")) as f:
        events = dict(line.split() for line in f)
    if p.returncode == -signal.SIGKILL:
        assert int(events["oom_kill"]) >= 1, events
    else:
        assert p.returncode == 0, p.stderr
        assert stopped and "errno 12" in stopped.group(2), p.stdout[-400:]
    added = int(stopped.group(1)) if stopped else max(counts, default=0)
    # 24 MiB holds ~100k watches at most: the memcg stopped it, not a count.
    assert 0 < added < (1 << 20) // 4, f"{added} watches added"
