# SPDX-License-Identifier: GPL-2.0
"""memwatch over pages a pinned MR holds, as a registration cache meets it:
what the watch says when the mm moves, splits or copies pages that cannot
move. Each test checks the watch against what really happened to the pages:
an RDMA WRITE through the MR after the event must land in what the process
sees at that address (the same pages), and an unpinned buffer beside it,
treated alike, shows what the event does to pages that can move."""
import contextlib
import ctypes
import os
import time

import pyverbs.enums as e
from pyverbs.mr import MR

from conftest import LoopbackQP, assert_bytes, libc, madvise, mmap_anon, munmap
from odpwatch_memwatch import MemWatch

PAGE = 4096
HUGE = 2 << 20
REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
MADV_HUGEPAGE = 14
PROT_READ = 0x1
SYS_MOVE_PAGES = 279  # x86_64
MPOL_MF_MOVE = 1 << 1


def pattern(length, seed):
    return bytes((i * 13 + seed) & 0xFF for i in range(length))


def fill(addr, length, byte):
    ctypes.memset(addr, byte, length)


def write_lands(ctx, pd, mr, addr, length, seed):
    """An RDMA WRITE of a fresh pattern through @mr at @addr: the process
    must see it there, else the MR holds other pages than the mapping."""
    src = MR(pd, length, e.IBV_ACCESS_LOCAL_WRITE)
    try:
        src.write(pattern(length, seed), length)
        qp = LoopbackQP(ctx, pd)
        assert qp.rdma(e.IBV_WR_RDMA_WRITE, src, src.buf, length, mr, addr) == \
            e.IBV_WC_SUCCESS
        assert_bytes(ctypes.string_at(addr, length), pattern(length, seed),
                     "what the process sees after an RDMA WRITE through the pinned MR")
    finally:
        src.close()


def pages_nodes(addr, n, target=None):
    """move_pages(2) of @n pages at @addr: to @target, or (None) only ask
    where each page is. Returns the status of each page (its node, or
    -errno); with a target, also the number of pages that did not move."""
    pages = (ctypes.c_void_p * n)(*[addr + i * PAGE for i in range(n)])
    status = (ctypes.c_int * n)()
    nodes = (ctypes.c_int * n)(*([target] * n)) if target is not None else None
    rc = libc.syscall(SYS_MOVE_PAGES, 0, ctypes.c_ulong(n), pages, nodes, status,
                      MPOL_MF_MOVE if target is not None else 0)
    assert rc >= 0, f"move_pages: {os.strerror(ctypes.get_errno())}"
    return list(status) if target is None else (list(status), rc)


def numa_nodes():
    return sorted(int(d[4:]) for d in os.listdir("/sys/devices/system/node")
                  if d.startswith("node") and d[4:].isdigit())


@contextlib.contextmanager
def pinned_beside_unpinned(pd, n, seeds, mergeable=False):
    """Two buffers of n bytes filled with seeds[0] and seeds[1] (made
    MADV_MERGEABLE first if asked), the first held by a pinned MR, each
    watched (cookies 1 and 2). Yields (mr, pinned_buf, loose_buf, mw,
    pinned, loose)."""
    pinned_buf, loose_buf = mmap_anon(n), mmap_anon(n)
    fill(pinned_buf, n, seeds[0])
    fill(loose_buf, n, seeds[1])
    if mergeable:
        madvise(pinned_buf, n, MADV_MERGEABLE)
        madvise(loose_buf, n, MADV_MERGEABLE)
    mr = MR(pd, n, REMOTE, address=pinned_buf)
    try:
        with MemWatch(nonblock=True) as mw:
            yield mr, pinned_buf, loose_buf, mw, mw.add(pinned_buf, n, cookie=1), \
                mw.add(loose_buf, n, cookie=2)
    finally:
        mr.close()
        munmap(pinned_buf, n)
        munmap(loose_buf, n)


def test_fork_leaves_a_pinned_buffer_and_its_watch_alone(ctx, pd):
    """fork() copies pages pinned for DMA into the child at once instead of
    sharing them copy-on-write: the parent keeps its pages, and its next
    write to them changes nothing a watch cares about. An unpinned buffer,
    the same way, is shared COW: the parent's write moves it to a new page
    (CLEAR)."""
    n = 4 * PAGE
    with pinned_beside_unpinned(pd, n, (1, 2)) as (mr, pinned_buf, loose_buf, mw, pinned, loose):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.read(r, 1)  # alive, sharing what fork shared, until the writes
            os._exit(0)
        try:
            fill(pinned_buf, n, 3)
            fill(loose_buf, n, 4)
        finally:
            os.write(w, b"x")
            os.waitpid(pid, 0)
            os.close(r)
            os.close(w)
        events = {ev.cookie for ev in mw.read_events()}
        print(f"after fork and the parent's writes: pinned valid {pinned.is_valid()}, "
              f"unpinned valid {loose.is_valid()}, records for {sorted(events)}")
        assert not loose.is_valid() and 2 in events, "COW of the unpinned buffer unseen"
        assert pinned.is_valid() and 1 not in events, \
            "the pinned buffer's watch changed, but its pages did not"
        write_lands(ctx, pd, mr, pinned_buf, n, 5)


def test_migration_of_pinned_pages(ctx, pd):
    """move_pages() to the other NUMA node: unpinned pages move (new pages:
    CLEAR); pinned pages cannot (the MR holds them) and stay where they were.
    The migration unmaps them before it finds them pinned, so their watch
    changes too: a false positive a cache pays with one re-registration."""
    nodes = numa_nodes()
    assert len(nodes) >= 2, f"the guest has NUMA nodes {nodes}; this test needs two"
    n = 4 * PAGE
    with pinned_beside_unpinned(pd, n, (1, 2)) as (mr, pinned_buf, loose_buf, mw, pinned, loose):
        before = pages_nodes(pinned_buf, 4)
        target = next(x for x in nodes if x != before[0])
        moved_loose = pages_nodes(loose_buf, 4, target)
        moved_pinned = pages_nodes(pinned_buf, 4, target)
        after = pages_nodes(pinned_buf, 4)
        events = {ev.cookie: ev.reasons for ev in mw.read_events()}
        print(f"pinned pages on {before}, move_pages to {target}: (status, pages not "
              f"moved) {moved_pinned}, then on {after}; unpinned {moved_loose}, then on "
              f"{pages_nodes(loose_buf, 4)}; records {events}; valid: pinned "
              f"{pinned.is_valid()}, unpinned {loose.is_valid()}")
        assert moved_loose[1] == 0 and pages_nodes(loose_buf, 4) == [target] * 4
        assert not loose.is_valid() and 2 in events
        assert moved_pinned[1] == 4 and after == before, "pinned pages moved"
        write_lands(ctx, pd, mr, pinned_buf, n, 5)
        assert not pinned.is_valid() and 1 in events, \
            "the failed migration of the pinned pages left their watch alone"


def anon_huge_kib(addr):
    """AnonHugePages of the mapping holding @addr (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def test_split_of_a_pinned_huge_page(ctx, pd):
    """A transparent huge page held by a pinned MR, and an mprotect() of its
    first page: the VMA splits there, which splits the huge page's mapping
    into page tables (CLEAR over the whole 2 MiB block). The pages stay: the
    MR still writes what the process reads. The watch on the block's last
    page changes anyway, a false positive (memwatch.rst: splitting a VMA)."""
    raw = mmap_anon(2 * HUGE)
    blk = (raw + HUGE - 1) & ~(HUGE - 1)
    madvise(blk, HUGE, MADV_HUGEPAGE)
    fill(blk, HUGE, 1)
    huge = anon_huge_kib(blk)
    assert huge >= 2048, f"no transparent huge page here (AnonHugePages {huge} kB)"
    mr = MR(pd, HUGE, REMOTE, address=blk)
    try:
        with MemWatch(nonblock=True) as mw:
            last = blk + HUGE - PAGE
            watch = mw.add(last, PAGE, cookie=1)
            assert libc.mprotect(ctypes.c_void_p(blk), ctypes.c_size_t(PAGE), PROT_READ) == 0
            events = mw.read_events()
            print(f"AnonHugePages {huge} kB before, {anon_huge_kib(last)} kB after the "
                  f"split; watch valid {watch.is_valid()}; records {events}")
            write_lands(ctx, pd, mr, last, PAGE, 5)
            assert not watch.is_valid() and [ev.cookie for ev in events] == [1]
    finally:
        mr.close()
        munmap(raw, 2 * HUGE)


KSM = "/sys/kernel/mm/ksm/"
MADV_MERGEABLE = 12


def ksm_knob(name, value=None):
    with open(KSM + name, "r+" if value is not None else "r") as f:
        old = f.read().strip()
        if value is not None:
            f.write(str(value))
    return old


def test_ksm_over_pinned_pages(ctx, pd):
    """KSM scanning mergeable memory: two equal pages a pinned MR holds
    are never merged (the MR still writes what the process reads), and KSM
    leaves their watch alone: it skips a pinned page before invalidating it
    (the series' mm/ksm patch; before it, every pass changed the watch, a
    re-registration storm and a content oracle). Two equal unpinned pages
    beside them are merged (CLEAR): they are the process's only merged
    pages."""
    n = 2 * PAGE
    saved = {k: ksm_knob(k) for k in ("run", "sleep_millisecs", "pages_to_scan")}
    with pinned_beside_unpinned(pd, n, (7, 7), mergeable=True) as \
            (mr, pinned_buf, loose_buf, mw, pinned, loose):
        try:
            ksm_knob("sleep_millisecs", 10)
            ksm_knob("pages_to_scan", 1000)
            scans = int(ksm_knob("full_scans"))
            ksm_knob("run", 1)
            deadline = time.monotonic() + 120
            while int(ksm_knob("full_scans")) < scans + 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            done = int(ksm_knob("full_scans")) - scans
            ksm_knob("run", 0)
            events = {ev.cookie for ev in mw.read_events()}
            with open("/proc/self/ksm_merging_pages") as f:
                merged = int(f.read())
            print(f"{done} full KSM scans; {merged} of this process's pages merged; valid: "
                  f"pinned {pinned.is_valid()}, unpinned {loose.is_valid()}; "
                  f"records {sorted(events)}")
            assert done >= 3, f"KSM made {done} full scans in 120 s"
            assert not loose.is_valid() and 2 in events and merged == 2, "not the 2 unpinned merged"
            write_lands(ctx, pd, mr, pinned_buf, n, 9)
            assert ctypes.string_at(loose_buf, n) == bytes([7]) * n
            assert pinned.is_valid() and 1 not in events, \
                "KSM invalidated the pinned pages it cannot merge"
        finally:
            ksm_knob("run", 0)
            for k in ("sleep_millisecs", "pages_to_scan"):
                ksm_knob(k, saved[k])
            ksm_knob("run", saved["run"])
