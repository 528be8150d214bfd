# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Limits: RLIMIT_MEMLOCK holds pinned MRs and not ODP MRs; watches are
charged to the memory cgroup of the process that adds them, so a cgroup's
limit stops a flood of watches (ENOMEM or the cgroup's OOM killer), long
before the per-descriptor or per-user limits. The per-user, per-descriptor
and queue limits themselves are the memwatch kselftests'."""
import contextlib
import ctypes
import errno
import os
import re
import signal
import struct
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


def test_removed_watches_leave_no_word_pages(memcg):
    """Eight descriptors each add 64k watches and remove them all, and stay
    open: the pages of generation words (8 bytes an id, 4 MiB in all) go
    with their last watch, not with the descriptor (memwatch review, Low 8:
    128 descriptors kept about 1 GiB that no limit counted)."""
    p = run_in(memcg, "watch-churn", "8", "65536")
    print(p.stdout)
    assert p.returncode == 0, p.stderr
    empty, churned, words = map(int, re.search(
        r"empty (\d+) churned (\d+); words used (\d+)", p.stdout).groups())
    # Within the memory cgroup's per-CPU charge slack, not the words' 4 MiB.
    assert churned - empty < words // 4, p.stdout


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


@contextlib.contextmanager
def zram_swap(size):
    """A zram swap device of @size bytes (uncompressed), with a version-1
    swap header written here (no mkswap needed); off and reset after."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/sys/block/zram0/disksize", "w") as f:
        f.write(str(size))
    hdr = bytearray(page)
    hdr[1024:1032] = struct.pack("<II", 1, size // page - 1)  # version, last_page
    hdr[page - 10:] = b"SWAPSPACE2"
    with open("/dev/zram0", "r+b") as f:
        f.write(hdr)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.swapon(b"/dev/zram0", 0):
        raise OSError(ctypes.get_errno(), "swapon /dev/zram0")
    try:
        yield
    finally:
        libc.swapoff(b"/dev/zram0")
        with open("/sys/block/zram0/reset", "w") as f:
            f.write("1")


@pytest.mark.parametrize("resident", [2, 4])
def test_demand_paging_beyond_memory(resident):
    """An ODP MR over 64 MiB (ODPWATCH_BEYOND_MIB) whose memory cgroup may
    keep only 1/2 or 1/4 of it resident, zram swap behind it: RDMA WRITE of
    every 1 MiB chunk, then RDMA READ of each back, byte-exact while pages go
    out to swap and come back for the transfers. A pinned registration of
    the same buffer fails cleanly (ENOMEM under RLIMIT_MEMLOCK), pinning
    nothing."""
    mib = int(os.environ.get("ODPWATCH_BEYOND_MIB", "64"))
    with zram_swap(4 * mib << 20), memory_cgroup("odpwatch-beyond",
                                                 (mib << 20) // resident) as cg:
        p = run_in(cg, "beyond-memory", str(mib))
    print(p.stdout)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"pages swapped out (\d+) during the writes, (\d+) in all; swapped in (\d+); "
                  r"(\d+) chunks wrong", p.stdout)
    assert m, p.stdout
    out_writing, out_all, swapped_in, wrong = map(int, m.groups())
    assert wrong == 0, p.stdout
    # Beyond memory indeed: the writes pushed pages out, the reads brought
    # them back.
    assert out_writing > 0 and swapped_in > 0, p.stdout
    m = re.search(r"pinned: registration of the \d+ MiB: errno (\d+) .*VmPin (\d+) KiB -> (\d+) KiB",
                  p.stdout)
    assert m and int(m[1]) == errno.ENOMEM and m[2] == m[3], p.stdout


PIN_PHASE = re.compile(r"phase (\d+) (peak|freed|failed): (\d+) MiB in buffers, rss (\d+) KiB, "
                       r"pinned (\d+) KiB, registrations (\d+)")
PIN_PHASES = 12  # odpwatch-limits pin-forever's workload


def pin_forever(policy, memlock_mib=160):
    """Run the pin-forever workload under @policy; its phase lines as
    (phase, when, MiB in buffers, rss KiB, pinned KiB, registrations)."""
    p = subprocess.run([PROBE, "pin-forever", policy, str(memlock_mib)],
                       capture_output=True, text=True, timeout=900)
    print(p.stdout)
    rows = [(int(m[1]), m[2], int(m[3]), int(m[4]), int(m[5]), int(m[6]))
            for m in PIN_PHASE.finditer(p.stdout)]
    return p, rows


def test_pin_forever_keeps_its_peak_and_stops_at_the_memlock_limit():
    """The workaround MPI libraries used before they could learn of unmaps:
    malloc never gives memory back (M_TRIM_THRESHOLD, M_MMAP_MAX 0) and
    every registration is kept for ever. Over an irregular workload (phases
    of 2 to 128 MiB of buffers, each registered, sent from and freed) it
    keeps the memory of its peak resident and pinned once the phase that
    needed it is over, and RLIMIT_MEMLOCK (160 MiB, CAP_IPC_LOCK dropped)
    stops it with ENOMEM before the largest phase."""
    p, rows = pin_forever("pin-forever")
    assert p.returncode == 3 and "errno 12" in p.stdout, p.stdout + p.stderr
    after_peak = [r for r in rows if r[1] == "freed" and r[0] >= 3]
    assert after_peak, p.stdout
    # Phase 3 held 96 MiB: resident and pinned after it, whatever came next.
    assert all(r[3] >= 90 << 10 and r[4] >= 90 << 10 for r in after_peak), p.stdout
    assert not [r for r in rows if r[0] >= 8], "got to the largest phase: " + p.stdout


@pytest.mark.parametrize("policy", ["explicit-odp", "implicit-odp"])
def test_odp_cache_gives_memory_back_and_pins_nothing(policy):
    """The same workload through odpwatch's cache with an ODP policy runs to
    its end under the same limit: nothing pinned, and what a phase freed
    leaves the process (RSS back under 16 MiB after the 128 MiB phase)."""
    p, rows = pin_forever(policy)
    assert p.returncode == 0, p.stdout + p.stderr
    freed = [r for r in rows if r[1] == "freed"]
    assert [r[0] for r in freed] == list(range(PIN_PHASES)), p.stdout
    assert all(r[4] == 0 for r in rows), p.stdout
    assert freed[8][3] < 16 << 10, p.stdout


def test_memwatch_cache_releases_what_is_freed():
    """The same workload through odpwatch's cache with pinned registrations
    and memwatch: it runs to its end under the same limit, because what
    malloc gives back to the kernel is dropped from the cache (its watch
    changes) and deregistered, so after the 128 MiB phase both resident and
    pinned memory are back under 16 MiB."""
    p, rows = pin_forever("memwatch")
    assert p.returncode == 0, p.stdout + p.stderr
    freed = [r for r in rows if r[1] == "freed"]
    assert [r[0] for r in freed] == list(range(PIN_PHASES)), p.stdout
    # The largest phase's lines first: a CI log keeps only a reason's start.
    largest = "\n".join(ln for ln in p.stdout.splitlines() if ln.startswith("phase 8 "))
    assert max(r[4] for r in rows) > 100 << 10, \
        f"at most {max(r[4] for r in rows)} KiB pinned: {largest}\n{p.stdout}"
    assert freed[8][3] < 16 << 10 and freed[8][4] < 16 << 10, p.stdout
