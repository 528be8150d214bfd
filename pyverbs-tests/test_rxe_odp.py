# SPDX-License-Identifier: GPL-2.0
"""rxe On-Demand Paging as an application sees it: implicit MRs, huge pages,
data that follows the mapping through madvise, munmap/mmap and fork, and
traffic racing invalidations. Every check reads the bytes that moved."""
import contextlib
import ctypes
import errno
import fcntl
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from conftest import (CGROUP_ROOT, MADV_NOHUGEPAGE, MAP_ANONYMOUS, MAP_FAILED, MAP_HUGETLB,
                      MAP_PRIVATE, PROT_RW, LoopbackQP, assert_bytes, async_event, hw_counter,
                      libc, madvise, madvise_dontneed, memory_cgroup, mmap_anon, munmap,
                      odp_mr_past_a_files_end)
from rxe_env import mr_counters

LEN = 64 * 1024
PR_SET_THP_DISABLE = 41
HUGE = 2 << 20
ODP = (e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
       e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)


def pattern(length, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(length))


def poke(addr, data):
    ctypes.memmove(addr, data, len(data))


def peek(addr, length):
    return ctypes.string_at(addr, length)


@pytest.fixture
def local(pd):
    """A pinned buffer on the requester's side of every transfer."""
    mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE)
    yield mr
    mr.close()


@pytest.fixture
def implicit(pd):
    mr = MR(pd, 0, ODP, implicit=True)
    yield mr
    mr.close()


@pytest.fixture(params=["explicit", "implicit"])
def odp_buffer(request, pd):
    """A 64 KiB buffer and an ODP MR that reaches it: its own, or an implicit one."""
    buf = mmap_anon(LEN)
    if request.param == "implicit":
        mr = MR(pd, 0, ODP, implicit=True)
    else:
        mr = MR(pd, LEN, ODP, address=buf)
    yield mr, buf
    mr.close()
    munmap(buf, LEN)


def test_implicit_advertised(ctx):
    assert ctx.query_device_ex().odp_caps.general_caps & e.IBV_ODP_SUPPORT_IMPLICIT


def test_implicit_send_recv(loopback, implicit):
    """The implicit MR's lkey serves both the send and the receive buffer."""
    src, dst = mmap_anon(LEN), mmap_anon(LEN)
    try:
        poke(src, pattern(LEN, 1))
        assert loopback.send_recv(implicit, src, implicit, dst, LEN) == \
            (e.IBV_WC_SUCCESS, e.IBV_WC_SUCCESS)
        assert_bytes(peek(dst, LEN), pattern(LEN, 1))
    finally:
        munmap(src, LEN)
        munmap(dst, LEN)


def test_implicit_remote_write_read_atomic(loopback, implicit, local):
    buf = mmap_anon(LEN)
    try:
        local.write(pattern(LEN, 2), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                             implicit, buf) == e.IBV_WC_SUCCESS
        assert_bytes(peek(buf, LEN), pattern(LEN, 2))
        poke(buf, pattern(LEN, 3))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             implicit, buf) == e.IBV_WC_SUCCESS
        assert_bytes(local.read(LEN, 0), pattern(LEN, 3))
        poke(buf + 8, (1000).to_bytes(8, "little"))
        assert loopback.fetch_add(local, local.buf, implicit, buf + 8, 24) == e.IBV_WC_SUCCESS
        assert int.from_bytes(local.read(8, 0), "little") == 1000
        assert int.from_bytes(peek(buf + 8, 8), "little") == 1024
    finally:
        munmap(buf, LEN)


def test_zero_length_read_and_write_complete(loopback, local, odp_buffer):
    """RDMA READ and WRITE of 0 bytes complete, as UCX posts them (a READ
    of nothing is its fence): they name no MR, and the responder's copy
    must not look at one. Node 1 of the middleware suite oopsed on a NULL
    MR in resp_mr_copy() before 0039 checked for it."""
    mr, buf = odp_buffer
    for opcode in (e.IBV_WR_RDMA_READ, e.IBV_WR_RDMA_WRITE):
        for _ in range(3):
            assert loopback.rdma(opcode, local, local.buf, 0, mr, buf) == e.IBV_WC_SUCCESS, opcode
    local.write(pattern(LEN, 7), LEN)
    assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN, mr, buf) == e.IBV_WC_SUCCESS
    assert_bytes(peek(buf, LEN), pattern(LEN, 7))


def test_hugetlb_odp_mr(pd, loopback, local):
    """IBV_ACCESS_HUGETLB over 2 MiB pages; transfers cross 4 KiB boundaries."""
    buf = mmap_anon(HUGE, flags=MAP_HUGETLB)
    mr = MR(pd, HUGE, ODP | e.IBV_ACCESS_HUGETLB, address=buf)
    try:
        off = (1 << 20) - 100
        local.write(pattern(LEN, 4), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                             mr, buf + off) == e.IBV_WC_SUCCESS
        assert_bytes(peek(buf + off, LEN), pattern(LEN, 4))
        poke(buf + HUGE - LEN, pattern(LEN, 5))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf + HUGE - LEN) == e.IBV_WC_SUCCESS
        assert_bytes(local.read(LEN, 0), pattern(LEN, 5))
    finally:
        mr.close()
        munmap(buf, HUGE)


def test_hugetlb_flag_over_small_pages(pd, loopback, local):
    """IBV_ACCESS_HUGETLB over 4 KiB pages (THP kept off) works like any ODP MR:
    rxe's page list is per 4 KiB page whatever backs it."""
    buf = mmap_anon(HUGE)
    madvise(buf, HUGE, MADV_NOHUGEPAGE)
    mr = MR(pd, HUGE, ODP | e.IBV_ACCESS_HUGETLB, address=buf)
    try:
        local.write(pattern(LEN, 6), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                             mr, buf + 12345) == e.IBV_WC_SUCCESS
        assert_bytes(peek(buf + 12345, LEN), pattern(LEN, 6))
    finally:
        mr.close()
        munmap(buf, HUGE)


def test_data_follows_madvise_and_remap(loopback, local, odp_buffer):
    """Each cycle changes the pages behind the buffer; RDMA READ sees the current ones."""
    mr, buf = odp_buffer
    for cycle in range(6):
        if cycle % 2:
            madvise_dontneed(buf, LEN)              # zero-filled on next touch
        else:
            munmap(buf, LEN)
            assert mmap_anon(LEN, addr=buf) == buf
        poke(buf, pattern(LEN, 10 + cycle))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        assert_bytes(local.read(LEN, 0), pattern(LEN, 10 + cycle), f"cycle {cycle}")


def test_fork_cow_with_odp_mr(pd, loopback, local):
    """After fork, the parent's writes break COW onto new pages; ODP follows them."""
    buf = mmap_anon(LEN)
    mr = MR(pd, LEN, ODP, address=buf)
    try:
        poke(buf, pattern(LEN, 20))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                # the child scribbles on its copy
            poke(buf, pattern(LEN, 21))
            os.write(w, b"x")
            os._exit(0)
        os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        assert_bytes(local.read(LEN, 0), pattern(LEN, 20), "saw the child's copy")
        poke(buf, pattern(LEN, 22))                 # COW break in the parent
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        assert_bytes(local.read(LEN, 0), pattern(LEN, 22))
    finally:
        mr.close()
        munmap(buf, LEN)


def test_traffic_races_invalidation(loopback, local, odp_buffer):
    """A thread zaps the pages while RDMA WRITEs land: no error, last write wins."""
    mr, buf = odp_buffer
    stop = threading.Event()
    zaps = 0

    def zapper():
        nonlocal zaps
        while not stop.is_set():
            madvise_dontneed(buf, LEN)
            zaps += 1

    t = threading.Thread(target=zapper)
    t.start()
    try:
        for i in range(150):
            local.write(pattern(LEN, i), LEN)
            assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                                 mr, buf) == e.IBV_WC_SUCCESS, f"write {i}"
    finally:
        stop.set()
        t.join()
    assert zaps > 10, f"only {zaps} invalidations raced the writes"
    local.write(pattern(LEN, 200), LEN)
    assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                         mr, buf) == e.IBV_WC_SUCCESS
    assert_bytes(peek(buf, LEN), pattern(LEN, 200))


def test_first_touch_write_faults_off_the_qp(pd, loopback):
    """A 16 MiB RDMA WRITE into untouched ODP memory: the responder answers
    absent pages with RNR NAKs while the faults run elsewhere, and the 4 MiB
    fault-around keeps them few (one per page would be 4096)."""
    size = 16 << 20
    src_buf, dst_buf = mmap_anon(size), mmap_anon(size)
    src = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=src_buf)   # pinned
    dst = MR(pd, size, ODP, address=dst_buf)
    try:
        ctypes.memset(src_buf, 0x6B, size)
        rnr0, faulted0 = hw_counter("rcvd_rnr_err"), hw_counter("odp_page_faults")
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, src, src_buf, size,
                             dst, dst_buf, timeout=600) == e.IBV_WC_SUCCESS
        rnr = hw_counter("rcvd_rnr_err") - rnr0
        faulted = hw_counter("odp_page_faults") - faulted0
        assert_bytes(peek(dst_buf, 4096), b"\x6b" * 4096)
        assert_bytes(peek(dst_buf + size - 4096, 4096), b"\x6b" * 4096)
        assert faulted >= size // 4096, f"{faulted} pages faulted in"
        assert 1 <= rnr <= 64, f"{rnr} RNR NAKs for {size >> 20} MiB"
    finally:
        dst.close()
        src.close()
        munmap(src_buf, size)
        munmap(dst_buf, size)


def test_a_fault_that_succeeded_leaves_the_next_one_off_the_qp(ctx, pd, local):
    """A responder that answered an access RNR and finds the pages absent
    again on the retry faults in place (the queued fault was slow or
    failed). Once the queued fault succeeded and the retry went through,
    that mark must go: a later fault at the same address, after the pages
    were taken away again, is answered RNR and queued like the first, not
    faulted in the QP's task (rxe review L-d). The responder's RNR timer is
    long (491 ms) so the retry surely finds the first fault done."""
    a, b = LoopbackQP(ctx, pd, connect=False), LoopbackQP(ctx, pd, connect=False)
    for q in (a, b):
        q.attr.min_rnr_timer = 31
    a.connect(b.qp.qp_num)
    b.connect(a.qp.qp_num)
    buf = mmap_anon(LEN)
    mr = MR(pd, LEN, ODP, address=buf)
    try:
        rnr = []
        for seed in (1, 2):
            local.write(pattern(64, seed), 64)
            rnr0 = hw_counter("rcvd_rnr_err")
            assert a.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 64, mr, buf,
                          timeout=60) == e.IBV_WC_SUCCESS
            rnr.append(hw_counter("rcvd_rnr_err") - rnr0)
            assert_bytes(peek(buf, 64), pattern(64, seed))
            madvise_dontneed(buf, LEN)
            time.sleep(0.5)  # past the churn window, where faults go in place
        print(f"RNR NAKs: first touch {rnr[0]}, the same address again {rnr[1]}")
        assert rnr[0] >= 1, "the first touch was not answered RNR"
        assert rnr[1] >= 1, "the second fault at the address ran in the QP's task"
    finally:
        mr.close()
        munmap(buf, LEN)


def test_churn_elsewhere_leaves_faults_off_the_qp(pd, loopback, implicit, local):
    """Right after an invalidation dropped pages of an MR, a fault of those
    pages runs in place (the memory is being reused, the fault is cheap).
    On an implicit MR, which spans every mapping of the process, churn of
    other memory (a buffer used through the MR and unmapped, as a
    malloc-heavy program does all the time) must not send the MR's other
    faults there: a WRITE into untouched memory right after such an unmap
    is still answered with an RNR NAK while its fault runs off the QP (rxe
    review M4). Three rounds, each within the 100 ms the heuristic lasts."""
    churn_len = 64 << 10
    rnr = []
    for round_ in range(3):
        elsewhere, fresh = mmap_anon(churn_len), mmap_anon(LEN)
        try:
            pd.advise_mr(PREFETCH_WRITE, ADVISE_FLUSH, [SGE(elsewhere, churn_len, implicit.lkey)])
            local.write(pattern(64, round_), 64)
            rnr0 = hw_counter("rcvd_rnr_err")
            munmap(elsewhere, churn_len)  # drops pages the MR mapped
            assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 64, implicit, fresh,
                                 timeout=60) == e.IBV_WC_SUCCESS
            rnr.append(hw_counter("rcvd_rnr_err") - rnr0)
            assert_bytes(peek(fresh, 64), pattern(64, round_))
        finally:
            munmap(fresh, LEN)
    print(f"RNR NAKs of a first touch right after an unmap elsewhere: {rnr}")
    assert sum(rnr) >= 1, "every fault ran in the QP's task"


def test_write_with_imm_into_absent_odp_pages_takes_one_srq_receive_each(ctx, pd, local):
    """RDMA WRITE with immediate into untouched ODP pages, receives from an
    SRQ: the responder answers each absent page with an RNR NAK, and the
    retried write must still consume exactly one receive, in order. (A
    receive taken before the RNR and not given back is lost: the next write
    completes the following receive, and an application waiting for its
    wr_id hangs.)"""
    # 8 MiB apart: each write lands beyond the last fault's 4 MiB fault-around.
    writes, page, stride = 6, 4096, 8 << 20
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=2 * writes, max_sge=1)))
    qp = LoopbackQP(ctx, pd, srq=srq)
    buf = mmap_anon(writes * stride)
    mr = MR(pd, writes * stride, ODP, address=buf)
    try:
        for i in range(2 * writes):
            srq.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(local.buf, 1, local.lkey)]))
        local.write(pattern(page, 9), page)
        rnr0 = hw_counter("rcvd_rnr_err")
        got = []
        for i in range(writes):
            wr = SendWR(wr_id=100 + i, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                        sg=[SGE(local.buf, 64, local.lkey)], imm_data=i)
            wr.set_wr_rdma(mr.rkey, buf + i * stride)
            qp.qp.post_send(wr)
            wcs, deadline = [], time.monotonic() + 60
            while len(wcs) < 2:
                assert time.monotonic() < deadline, f"write {i}: {len(wcs)} of 2 completions"
                n, polled = qp.cq.poll()
                wcs += polled[:n] if n else []
            for wc in wcs:
                assert wc.status == e.IBV_WC_SUCCESS, f"write {i}: {wc.status}"
                if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
                    # imm_data as it came off the wire (network order) or not
                    imm = wc.imm_data if wc.imm_data < 256 else socket.ntohl(wc.imm_data)
                    got.append((wc.wr_id, imm))
        assert hw_counter("rcvd_rnr_err") - rnr0 >= writes, "the writes did not meet absent pages"
        assert got == [(i, i) for i in range(writes)], "receives lost or out of order"
        assert_bytes(peek(buf + (writes - 1) * stride, 64), pattern(64, 9))
    finally:
        mr.close()
        munmap(buf, writes * stride)


MADV_FREE, MADV_PAGEOUT = 8, 21


def test_pages_written_through_odp_survive_reclaim(pd, loopback, local):
    """RDMA writes into ODP pages go through the kernel's mapping, never the
    user's PTE: unless the driver marks the pages dirty, a page that reclaim
    may drop when clean loses them. MADV_FREE makes a page lazily freeable
    (dropped on reclaim if still clean), the RDMA WRITE fills it,
    MADV_PAGEOUT reclaims it: the written bytes must still be there. A
    control page outside the MR, treated the same but not written, must be
    gone (else reclaim did not run and the test proved nothing). One CPU
    throughout: the pages must have left this CPU's LRU batches, which
    MADV_PAGEOUT drains, before reclaim can see them."""
    page = 4096
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    buf, control = mmap_anon(LEN), mmap_anon(page)
    mr = MR(pd, LEN, ODP, address=buf)
    try:
        poke(buf, pattern(LEN, 40))            # present pages, then lazily freeable
        poke(control, pattern(page, 40))
        madvise(buf, LEN, MADV_FREE)
        madvise(control, page, MADV_FREE)
        local.write(pattern(LEN, 41), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN, mr, buf) == \
            e.IBV_WC_SUCCESS
        madvise(control, page, MADV_PAGEOUT)
        madvise(buf, LEN, MADV_PAGEOUT)
        assert_bytes(peek(control, page), bytes(page),
                     "a clean lazily freeable page survived MADV_PAGEOUT: reclaim did not run")
        got = peek(buf, LEN)
        zeros = sum(1 for i in range(0, LEN, page) if got[i:i + page] == bytes(page))
        assert_bytes(got, pattern(LEN, 41), f"{zeros} of {LEN // page} written pages came back "
                     "as zeros; the written buffer")
    finally:
        os.sched_setaffinity(0, cpus)
        mr.close()
        munmap(buf, LEN)
        munmap(control, page)


# The owner of an implicit MR, in its own process: it prints its QP number,
# the MR's rkey and a buffer's address, connects to the QP number it reads,
# and on "exit" forks a child that keeps the verbs file (and with it the QP
# and the MR) open, prints the child's PID and exits.
IMPLICIT_OWNER = """
import os, sys, time
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from conftest import RDMA_DEV, LoopbackQP, mmap_anon
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
import pyverbs.enums as e
ctx = Context(name=RDMA_DEV)
pd = PD(ctx)
mr = MR(pd, 0, e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE,
        implicit=True)
qp = LoopbackQP(ctx, pd, connect=False)
buf = mmap_anon(4096)
print(qp.qp.qp_num, mr.rkey, buf, flush=True)
qp.connect(int(sys.stdin.readline()))
assert sys.stdin.readline().strip() == "exit"
holder = os.fork()
if holder == 0:
    time.sleep(600)
    os._exit(0)
print(holder, flush=True)
os._exit(0)
"""


def release_lazy_mm_references():
    """Run on every CPU for a moment. A CPU that last ran an exited process
    keeps a reference on its mm (lazy TLB) until it switches to another
    one: only then is an mm that nothing else holds freed."""
    cpus = os.sched_getaffinity(0)
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            time.sleep(0.05)
    finally:
        os.sched_setaffinity(0, cpus)


@pytest.mark.parametrize("touched", [False, True], ids=["never-touched", "touched-then-reaped"])
def test_implicit_mr_outliving_its_process(ctx, pd, local, touched):
    """An implicit MR whose process exited while a forked child keeps the
    verbs file open: the MR and its QP live on, the address space is gone.
    A peer's write into a region the MR never mapped must fail cleanly with
    a remote access error; the debug kernel's KASAN must see no access to
    the freed mm (the implicit MR must hold it, as explicit ones do through
    their interval notifiers). Each child holds the mm through its own
    notifier, so the mm can only be freed under the MR when it has no child:
    never touched, or touched and its child reaped after the exit."""
    # Without THP, so that khugepaged holds no reference on the owner's mm
    # (it keeps one until its next scan when the owner exits under it); in
    # a session of its own, so that no holder outlives a failed test.
    owner = subprocess.Popen([sys.executable, "-c", IMPLICIT_OWNER, __file__],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             start_new_session=True,
                             preexec_fn=lambda: libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0))
    holder = None
    warnings = len(kernel_warnings())
    try:
        qpn, rkey, buf = (int(x) for x in owner.stdout.readline().split())
        peer = LoopbackQP(ctx, pd, connect=False)
        peer.connect(qpn)
        owner.stdin.write(f"{peer.qp.qp_num}\n")
        owner.stdin.flush()

        class Remote:  # what LoopbackQP.rdma needs of the owner's MR
            pass
        remote = Remote()
        remote.rkey = rkey
        local.write(pattern(64, 3), 64)
        if touched:
            assert peer.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 64, remote, buf) == \
                e.IBV_WC_SUCCESS, "the write while the owner lives"
        owner.stdin.write("exit\n")
        owner.stdin.flush()
        holder = int(owner.stdout.readline())
        assert owner.wait(timeout=60) == 0
        time.sleep(2)  # the invalidations of the exit, and the reaping of children
        release_lazy_mm_references()
        # 1 GiB further: a region the MR never had a child for.
        status = peer.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 64, remote, buf + (1 << 30),
                           timeout=120)
        assert status == e.IBV_WC_REM_ACCESS_ERR, f"status {status}"
        # A use of the freed mm is KASAN's to see (debug kernel): blame it here.
        new = kernel_warnings()[warnings:]
        assert not new, new
    finally:
        with contextlib.suppress(ProcessLookupError):  # the holder, if any
            os.killpg(owner.pid, signal.SIGKILL)
        if holder:  # not our child (init reaps it): wait for it to go
            for _ in range(600):
                if not os.path.exists(f"/proc/{holder}"):
                    break
                time.sleep(0.1)
        owner.kill()
        owner.wait()


MAX_TRANSIENT = 16  # RXE_ODP_MAX_TRANSIENT: failed faults at one address answered RNR


def test_fault_past_a_files_end_is_a_remote_access_error(ctx, pd, local):
    """A page that is mapped but can never be faulted in (a shared file
    mapping past the file's end): the responder cannot tell that from a
    fault that ran out of memory, answers RNR, but at most MAX_TRANSIENT
    times in a row, then reports the remote access error that an unmapped
    address gets at once. Without the bound the WRITE would never end."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    with odp_mr_past_a_files_end(pd, LEN, ODP) as (buf, mr):
        rnr0 = hw_counter("rcvd_rnr_err")
        status = requester.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 4096,
                                mr, buf + 8192, timeout=120)
        rnr = hw_counter("rcvd_rnr_err") - rnr0
        print(f"status {status} after {rnr} RNR NAKs")
        assert status == e.IBV_WC_REM_ACCESS_ERR
        assert MAX_TRANSIENT <= rnr <= MAX_TRANSIENT + 4, f"{rnr} RNR NAKs"


def test_two_qps_faulting_past_a_files_end_both_get_the_error(ctx, pd, local):
    """The same as above from two QPs at once, on one MR at two addresses:
    the bound of MAX_TRANSIENT RNR answers holds for each QP. (With one
    retry state per MR, the two addresses took turns in it, each reset the
    other's count, and both WRITEs were answered RNR forever.)"""
    pairs = [LoopbackQP.pair(ctx, pd) for _ in range(2)]  # both ends kept alive
    qps = [requester for requester, _ in pairs]
    with odp_mr_past_a_files_end(pd, LEN, ODP) as (buf, mr):
        for i, q in enumerate(qps):
            wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                        sg=[SGE(local.buf + i * 4096, 4096, local.lkey)])
            wr.set_wr_rdma(mr.rkey, buf + 8192 + i * 16384)
            q.qp.post_send(wr)
        statuses = [q.wait(timeout=120) for q in qps]
        assert statuses == [e.IBV_WC_REM_ACCESS_ERR] * 2, statuses


# ibv_advise_mr's advice and flag values (uapi ib_user_ioctl_verbs.h).
PREFETCH, PREFETCH_WRITE, PREFETCH_NO_FAULT = 0, 1, 2
ADVISE_FLUSH = 1
CHILD = 128 << 20  # RXE_ODP_CHILD_SIZE: what one child of an implicit MR covers
MAP_NORESERVE = 0x4000


def mem_free_kib():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemFree:"))


def unmapped_space(length):
    """An address range with nothing mapped in it (reserved, then released)."""
    addr = libc.mmap(None, length, 0, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    assert addr not in (None, MAP_FAILED)
    munmap(addr, length)
    return (addr + CHILD - 1) & ~(CHILD - 1)


@pytest.mark.parametrize("advice", [PREFETCH_NO_FAULT, PREFETCH])
def test_prefetching_unmapped_space_leaves_no_children(pd, implicit, advice):
    """Each 128 MiB an implicit MR is asked to map gets a child (a page list
    of 256 KiB and an interval notifier). Prefetches of unmapped space, which
    a peer's accesses to unmapped addresses resemble, must not leave one
    behind for each 128 MiB they named: NO_FAULT makes none, a failed fault
    gives its child back. Kernel memory stays flat over 256 such regions."""
    regions = 256
    base = unmapped_space((regions + 1) * CHILD)
    time.sleep(1)
    free0 = mem_free_kib()
    failures = 0
    for i in range(regions):
        try:
            pd.advise_mr(advice, ADVISE_FLUSH,
                         [SGE(base + i * CHILD, 4096, implicit.lkey)])
        except Exception:  # an unmapped range cannot be faulted in
            failures += 1
    # The reaper runs off a work queue; MemFree moves with all else the
    # kernel does meanwhile (on the debug kernel beside other guests, 26 MiB
    # once, with NO_FAULT, which makes no child): the least of five samples.
    samples = []
    for _ in range(5):
        time.sleep(1)
        samples.append(free0 - mem_free_kib())
    used = min(samples)
    print(f"{regions} prefetches ({failures} failed): {used} KiB of memory used")
    assert advice == PREFETCH_NO_FAULT or failures == regions
    # 256 children would hold 64 MiB of page lists.
    assert used < 16 << 10, f"{used} KiB kept for {regions} unmapped regions"


@pytest.mark.parametrize("kind", ["pinned", "odp"])
def test_remote_access_error_raises_qp_access_error_event(ctx, pd, local, kind):
    """A remote write that fails the responder's checks completes the
    requester with a remote access error, and (C9-222.1: it cannot be pinned
    on a receive) raises IBV_EVENT_QP_ACCESS_ERR on the responder's QP. A
    pinned MR (written past its end) shows the rule; an ODP MR (written
    where nothing is mapped any more) must follow it."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    buf = mmap_anon(LEN)
    if kind == "pinned":
        mr = MR(pd, LEN, ODP & ~e.IBV_ACCESS_ON_DEMAND, address=buf)
        target = buf + LEN  # past the MR
    else:
        mr = MR(pd, LEN, ODP, address=buf)
        target = buf
    munmap(buf, LEN)
    try:
        assert async_event(ctx, 0) is None, "an event before the test"
        status = requester.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 64, mr, target,
                                timeout=120)
        assert status == e.IBV_WC_REM_ACCESS_ERR, f"status {status}"
        assert async_event(ctx, 10) == e.IBV_EVENT_QP_ACCESS_ERR
    finally:
        mr.close()


SYS_userfaultfd = 323
UFFD_API = 0xAA
UFFDIO_API, UFFDIO_REGISTER, UFFDIO_ZEROPAGE = 0xC018AA3F, 0xC020AA00, 0xC020AA04
UFFDIO_REGISTER_MODE_MISSING = 1
# Longer than the 50 s rxe_cleanup() waits for an object's references.
HANDLER_DELAY = 60


def register_missing(uffd, addr, length):
    """Put [addr, addr + length) under @uffd, for its missing pages."""
    fcntl.ioctl(uffd, UFFDIO_API, bytearray(struct.pack("QQQ", UFFD_API, 0, 0)))
    fcntl.ioctl(uffd, UFFDIO_REGISTER, bytearray(struct.pack(
        "QQQQ", addr, length, UFFDIO_REGISTER_MODE_MISSING, 0)))


def post_write(qp, local, seed, rkey, addr):
    """Post a 64-byte RDMA WRITE of pattern(64, seed) from @local to @addr,
    without waiting for its completion."""
    local.write(pattern(64, seed), 64)
    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(local.buf, 64, local.lkey)])
    wr.set_wr_rdma(rkey, addr)
    qp.qp.post_send(wr)


def kernel_warnings():
    """Kernel log lines of warnings, bugs, and rxe's own failed cleanups."""
    r = subprocess.run(["dmesg"], capture_output=True, text=True, check=True)
    return [line for line in r.stdout.splitlines()
            if any(w in line for w in ("WARNING:", "BUG:", "Oops", "cleanup failed"))]


def thread_stacks(pid="self"):
    """Each thread of process @pid (this one): its state, wait channel and
    kernel stack, to say where one that does not end is stuck."""
    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as err:
            return f"({err.strerror})"
    out = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        d = f"/proc/{pid}/task/{tid}"
        state = next((ln[6:].strip() for ln in read(f"{d}/status").splitlines()
                      if ln.startswith("State:")), "?")
        out.append(f"thread {tid} ({read(f'{d}/comm')}) {state}, wchan {read(f'{d}/wchan')}:\n"
                   f"{read(f'{d}/stack')}")
    return "\n".join(out)


class UffdHandler:
    """Another process with @uffd that fills [start, start + length) of each
    range with zero pages, page by page, once @delay seconds passed or
    serve() asks for it. Not a thread of this one: pyverbs keeps the GIL
    through a verbs call, and one that waits for a fault on the range
    (ibv_destroy_qp() of a QP whose task faults in place, or a regressed
    ibv_dereg_mr()) would keep a thread from ever answering it, a hang
    instead of a failure."""

    def __init__(self, uffd, ranges, delay):
        code = ("import errno, fcntl, select, struct, sys\n"
                f"select.select([sys.stdin], [], [], {delay})\n"
                "print('serving', flush=True)\n"
                f"for start, length in {list(ranges)!r}:\n"
                "    for page in range(start, start + length, 4096):\n"
                "        try:\n"
                f"            fcntl.ioctl({uffd}, {UFFDIO_ZEROPAGE},\n"
                "                        bytearray(struct.pack('QQQq', page, 4096, 0, 0)))\n"
                "        except OSError as err:\n"
                "            if err.errno != errno.EEXIST:\n"
                "                raise\n")
        # Unbuffered: a write to a handler that just exited leaves nothing
        # behind for close() to flush into the broken pipe.
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(uffd,), bufsize=0,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.began = False

    def serving(self):
        """Whether it has begun to answer (a handler that died before it
        has not: its stdout is readable then too, at its end)."""
        if not self.began and select.select([self.proc.stdout], [], [], 0)[0]:
            self.began = self.proc.stdout.readline() == b"serving\n"
        return self.began

    def serve(self):
        """Answer now (if it has not yet)."""
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(b"\n")

    def _kill(self):
        try:
            stacks = thread_stacks(self.proc.pid)
        except OSError:  # it ended meanwhile
            stacks = ""
        self.proc.kill()
        self.proc.wait()
        return stacks

    def finish(self, timeout=120):
        """Its exit status once it answered everything; a failure, with
        where it was stuck, if it still runs after @timeout s (some
        hundred ioctls take seconds)."""
        self.serve()
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stacks = self._kill()
            raise AssertionError(f"the userfaultfd handler still ran after {timeout} s:\n"
                                 f"{stacks}") from None

    def close(self):
        """Answers (or is killed after 30 s), for a test's cleanup."""
        self.serve()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print(self._kill())
        self.proc.stdin.close()
        self.proc.stdout.close()


def test_dereg_waits_for_a_fault_stuck_on_userfaultfd(ctx, pd, local):
    """A fault may sleep as long as its page takes: here on a userfaultfd
    range whose handler answers after HANDLER_DELAY seconds. ibv_dereg_mr()
    of the MR meanwhile must wait for the fault, however long, and free
    the MR only then: giving up after 50 s frees it under the fault (a
    WARNING, and on the debug kernel KASAN's use-after-free once the
    handler answers)."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    buf = mmap_anon(LEN)
    uffd = libc.syscall(SYS_userfaultfd, os.O_CLOEXEC)
    assert uffd >= 0, os.strerror(ctypes.get_errno())
    handler = None
    try:
        register_missing(uffd, buf, LEN)
        mr = MR(pd, LEN, ODP, address=buf)
        warnings0 = len(kernel_warnings())
        post_write(requester, local, 5, mr.rkey, buf)
        # The fault is running once the userfaultfd has its page-fault
        # message (polled, not read: the handler answers by address).
        readable, _, _ = select.select([uffd], [], [], 30)
        assert readable, "the write never faulted"
        # The handler fills the range with zero pages after the delay.
        handler = UffdHandler(uffd, [(buf, LEN)], HANDLER_DELAY)
        t0 = time.monotonic()
        mr.close()
        took = time.monotonic() - t0
        print(f"ibv_dereg_mr took {took:.1f} s; the handler answered after {HANDLER_DELAY} s")
        assert handler.finish() == 0, "the userfaultfd handler failed"
        new = kernel_warnings()[warnings0:]
        assert not new, f"kernel warnings: {new}"
        assert took >= HANDLER_DELAY - 5, "dereg returned while the fault still waited"
        requester.wait(timeout=120)  # the write ends, one way or the other
    finally:
        if handler:
            handler.close()
        os.close(uffd)
        munmap(buf, LEN)


@pytest.mark.parametrize("work", ["prefetch", "responder-fault"])
def test_queued_work_never_outlives_its_mr(ctx, pd, local, work):
    """Work queued for an ODP MR holds it until the work ends, and its
    deregistration does not wait behind other MRs' work (rxe review H1).
    40 MRs lie over a userfaultfd range nobody serves yet and get 16
    asynchronous PREFETCH_WRITEs each, one per page: 640 work items that
    block, more than rxe's ODP work queue runs at once (512 in our guest,
    256 per NUMA node; 16 is the most an MR may have queued). MR B, over
    fresh memory, then gets work of its own, queued behind them (a
    prefetch, or the fault the responder queues for a peer's RDMA WRITE
    into an absent page), and is deregistered. ibv_dereg_mr() must return
    before the userfaultfd is served (up to 70 s later), with no kernel
    warning. Before, it gave up after 50 s ("cleanup failed", a WARNING)
    and B's work ran on the freed MR once the faults were answered (KASAN
    on the debug kernel); waiting for queued work alone would wait for the
    userfaultfd."""
    mrs = 40
    region, b = mmap_anon(mrs * LEN), mmap_anon(LEN)
    uffd = libc.syscall(SYS_userfaultfd, os.O_CLOEXEC)
    assert uffd >= 0, os.strerror(ctypes.get_errno())
    stuck, requester, handler = [], None, None
    try:
        register_missing(uffd, region, mrs * LEN)
        stuck = [MR(pd, LEN, ODP, address=region + i * LEN) for i in range(mrs)]
        mr_b = MR(pd, LEN, ODP, address=b)
        warnings0 = len(kernel_warnings())
        for i, mr in enumerate(stuck):
            for page in range(0, LEN, PAGE):
                pd.advise_mr(PREFETCH_WRITE, 0, [SGE(region + i * LEN + page, PAGE, mr.lkey)])
        readable, _, _ = select.select([uffd], [], [], 60)
        assert readable, "no prefetch faulted"
        # Every page, once B's deregistration returned, or at the latest
        # after 70 s (longer than rxe_cleanup()'s 50 s).
        handler = UffdHandler(uffd, [(region, mrs * LEN)], 70)
        if work == "prefetch":
            pd.advise_mr(PREFETCH_WRITE, 0, [SGE(b, LEN, mr_b.lkey)])
        else:
            requester, _responder = LoopbackQP.pair(ctx, pd)
            post_write(requester, local, 9, mr_b.rkey, b)
            time.sleep(1)  # the responder's check queues the fault
        t0 = time.monotonic()
        mr_b.close()
        took = time.monotonic() - t0
        before_served = not handler.serving()
        assert handler.finish() == 0, "the userfaultfd handler failed"
        if requester:
            requester.wait(timeout=120)  # the write ends, one way or the other
        for mr in stuck:
            mr.close()
        time.sleep(2)  # anything still queued runs
        print(f"ibv_dereg_mr of B took {took:.1f} s")
        new = kernel_warnings()[warnings0:]
        assert not new, f"kernel warnings: {new}"
        assert before_served, "ibv_dereg_mr waited for other MRs' faults"
    finally:
        if handler:
            handler.close()
        os.close(uffd)  # wakes any fault still waiting for it
        for mr in stuck:
            mr.close()
        munmap(region, mrs * LEN)
        munmap(b, LEN)


def test_a_stuck_fault_stalls_no_other_child(ctx, pd, local, implicit):
    """A fault may sleep as long as its page takes (here a userfaultfd range
    nobody serves for HANDLER_DELAY seconds) and holds the implicit MR's
    children while it does. Reaping the child of a range unmapped meanwhile
    must not make every other access to the MR wait behind that fault: a
    waiting writer of the children's semaphore queues each new reader, the
    check of every QP's access included (rxe review M3). A WRITE into a
    third child's present pages must complete long before the userfaultfd
    is served. (Its userfaultfd handler is another process: destroying a
    QP whose task faults in place on the unserved page waits for that
    fault, and pyverbs keeps the GIL through ibv_destroy_qp(), so a thread
    of this process could never answer it.)"""
    base = unmapped_space(4 * CHILD)
    stuck, gone, there = base, base + CHILD, base + 2 * CHILD  # three children
    for addr in (stuck, gone, there):
        mmap_anon(LEN, addr=addr)
    uffd = libc.syscall(SYS_userfaultfd, os.O_CLOEXEC)
    assert uffd >= 0, os.strerror(ctypes.get_errno())
    handler = None
    try:
        # The two other children exist and map their pages.
        for addr in (gone, there):
            pd.advise_mr(PREFETCH_WRITE, ADVISE_FLUSH, [SGE(addr, LEN, implicit.lkey)])
        register_missing(uffd, stuck, LEN)
        warnings0 = len(kernel_warnings())
        # Both responders stay referenced to the end: destroying the stuck
        # WRITE's waits for its task, which may be faulting in place.
        a, a_responder = LoopbackQP.pair(ctx, pd)
        post_write(a, local, 3, implicit.rkey, stuck)
        readable, _, _ = select.select([uffd], [], [], 30)
        assert readable, "the write never faulted"
        handler = UffdHandler(uffd, [(stuck, LEN)], HANDLER_DELAY)
        munmap(gone, LEN)  # its child maps nothing now: the reaper wants it
        time.sleep(1)
        b, b_responder = LoopbackQP.pair(ctx, pd)
        t0 = time.monotonic()
        status = b.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 64, implicit, there,
                        timeout=HANDLER_DELAY + 60)
        took, before_served = time.monotonic() - t0, not handler.serving()
        print(f"the WRITE into the third child took {took:.1f} s; "
              f"the userfaultfd was served {HANDLER_DELAY} s after the stuck fault began")
        assert handler.finish() == 0, "the userfaultfd handler failed"
        assert status == e.IBV_WC_SUCCESS, f"status {status}"
        assert before_served, f"the WRITE waited for the stuck fault ({took:.1f} s)"
        assert_bytes(peek(there, 64), pattern(64, 3), "the third child's bytes")
        # The stuck WRITE ends one way or the other: its retry faults in
        # the QP's task, which answers nothing for 60 s, so its requester
        # may run out of transport retries first.
        a.wait(timeout=120)
        new = kernel_warnings()[warnings0:]
        assert not new, f"kernel warnings: {new}"
    finally:
        if handler:
            handler.close()
        os.close(uffd)
        for addr in (stuck, there):
            munmap(addr, LEN)


def test_implicit_mr_refuses_flush_access(pd):
    """A FLUSH of a whole MR names its length: of an implicit MR, the whole
    address space (and rxe's flush length was cut to 32 bits on the way).
    An implicit MR does not take FLUSH access; an explicit one does."""
    for flush in (e.IBV_ACCESS_FLUSH_GLOBAL, e.IBV_ACCESS_FLUSH_PERSISTENT):
        with pytest.raises(Exception) as err:
            MR(pd, 0, ODP | flush, implicit=True)
        assert getattr(err.value, "error_code", None) == errno.EINVAL, err.value
    buf = mmap_anon(LEN)
    try:
        MR(pd, LEN, ODP | e.IBV_ACCESS_FLUSH_GLOBAL, address=buf).close()
    finally:
        munmap(buf, LEN)


WINDOW = 4 << 20  # RXE_ODP_FAULT_AROUND: the most one responder fault maps
PAGE = 4096
MADV_DONTFORK = 10


def settled_counters(mr, timeout=60):
    """The MR's ODP counters once its queued faults are done (unchanged for 1 s)."""
    deadline = time.monotonic() + timeout
    last = mr_counters(mr.lkey)
    while time.monotonic() < deadline:
        time.sleep(1)
        now = mr_counters(mr.lkey)
        if now == last:
            return {k: int(v) for k, v in now.items() if v.isdigit()}
        last = now
    raise TimeoutError(f"counters still moving: {last}")


def requester_without_rnr_retries(ctx, pd):
    """A loopback QP whose first RNR NAK ends its request: what one queued
    responder fault did can be read off the counters, with no retry after it."""
    qp = LoopbackQP(ctx, pd, connect=False)
    qp.attr.rnr_retry = 0
    qp.connect(qp.qp.qp_num)
    return qp


def test_one_queued_fault_maps_at_most_the_window(ctx, pd):
    """An RDMA READ names up to 2 GiB. The responder's RNR NAK for absent
    pages queues one fault: it must map the READ's first window (4 MiB), not
    the whole READ in one call, which a single invalidation anywhere in it
    would restart. A 64 MiB READ of untouched memory, answered RNR with no
    retry allowed: the one queued fault handled 1024 pages, not 16384."""
    size = 64 << 20
    qp = requester_without_rnr_retries(ctx, pd)
    src = mmap_anon(size)
    dst = mmap_anon(size)
    odp = MR(pd, size, ODP, address=src)
    pinned = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=dst)
    try:
        status = qp.rdma(e.IBV_WR_RDMA_READ, pinned, dst, size, odp, src, timeout=120)
        assert status == e.IBV_WC_RNR_RETRY_EXC_ERR, f"status {status}"
        c = settled_counters(odp)
        print(f"64 MiB READ, one RNR NAK: {c}")
        assert c["page_faults"] == WINDOW // PAGE, c
        assert c["page_faults_handled"] == 1, c
    finally:
        odp.close()
        pinned.close()
        munmap(src, size)
        munmap(dst, size)


def present_pages(addr, length):
    """How many pages of [addr, addr + length) the process has in memory (pagemap)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        words = struct.unpack(f"{length // PAGE}Q", f.read(length // PAGE * 8))
    return sum(1 for w in words if w >> 63)


def test_fault_around_stays_in_the_accessed_mapping(ctx, pd, local):
    """A responder fault brings in the rest of a 4 MiB window after the
    access, within the MR, but only in the mapping the access lies in: an
    access that ends where its mapping ends must not fault in the next
    mapping (another file, another purpose). Two adjacent 4 MiB mappings
    (split by MADV_DONTFORK), one ODP MR over both, a one-packet WRITE
    (1 KiB, the QP's MTU) that ends where the first mapping ends, answered
    RNR with no retry allowed: the one queued fault mapped 1 page, none of
    the second mapping. (With retries, a retry that comes before the queued
    fault is done faults in place, and the page is counted twice: that race
    made this test fail on the slow debug kernel.) Then the WRITE, sent again
    by a QP that may retry, lands."""
    size, n = 8 << 20, 1024
    buf = mmap_anon(size)
    madvise(buf + size // 2, size // 2, MADV_DONTFORK)
    odp = MR(pd, size, ODP, address=buf)
    try:
        local.write(pattern(n, 9), n)
        target = buf + size // 2 - n
        qp = requester_without_rnr_retries(ctx, pd)
        status = qp.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, n, odp, target, timeout=120)
        assert status == e.IBV_WC_RNR_RETRY_EXC_ERR, f"status {status}"
        c = settled_counters(odp)
        second = present_pages(buf + size // 2, size // 2)
        print(f"counters {c}; pages of the next mapping present: {second}")
        assert second == 0, f"{second} pages of the next mapping faulted in"
        assert (c["page_faults"], c["page_faults_handled"]) == (1, 1), c
        assert LoopbackQP(ctx, pd).rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, n, odp, target,
                                        timeout=120) == e.IBV_WC_SUCCESS
        assert_bytes(peek(target, n), pattern(n, 9))
    finally:
        odp.close()
        munmap(buf, size)


def test_hugetlb_access_needs_on_demand_paging(pd):
    """IBV_ACCESS_HUGETLB describes how an ODP MR's pages are mapped; a pinned
    MR has no use for it, and rxe refuses it there (EINVAL) rather than
    accept a flag it ignores. An ODP MR takes it."""
    buf = mmap_anon(LEN)
    try:
        with pytest.raises(Exception) as err:
            MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_HUGETLB, address=buf)
        assert getattr(err.value, "error_code", None) == errno.EINVAL, err.value
        MR(pd, LEN, ODP | e.IBV_ACCESS_HUGETLB, address=buf).close()
    finally:
        munmap(buf, LEN)


def test_flush_writes_back_what_is_there_and_faults_nothing(ctx, pd, local):
    """A FLUSH of an ODP MR makes durable what was written through it, and
    that is in pages its page list maps: it must not fault in the rest. A
    256 MiB ODP MR over unpopulated memory, one page written through it,
    then a FLUSH (persistent, the whole MR): it succeeds and faults no page
    (before, it read-faulted all 65536 pages, page tables and all; of a
    1 TiB sparse MR, 1 TiB)."""
    size = 256 << 20
    qp = LoopbackQP(ctx, pd, flush=True)
    buf = libc.mmap(None, size, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    assert buf not in (None, MAP_FAILED)
    mr = MR(pd, size, ODP | e.IBV_ACCESS_FLUSH_GLOBAL | e.IBV_ACCESS_FLUSH_PERSISTENT,
            address=buf)
    try:
        local.write(pattern(PAGE, 11), PAGE)
        assert qp.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, PAGE, mr, buf + size // 2,
                       timeout=120) == e.IBV_WC_SUCCESS
        before = settled_counters(mr)
        status = qp.flush(mr, buf, size, e.IBV_FLUSH_PERSISTENT, e.IBV_FLUSH_MR)
        after = settled_counters(mr)
        print(f"FLUSH status {status}; counters before {before}, after {after}")
        assert status == e.IBV_WC_SUCCESS, f"status {status}"
        assert after["page_faults"] == before["page_faults"], (before, after)
        assert after["page_faults_handled"] == before["page_faults_handled"], (before, after)
        assert_bytes(peek(buf + size // 2, PAGE), pattern(PAGE, 11))
    finally:
        mr.close()
        munmap(buf, size)


def cgroup_bytes(path):
    with open(os.path.join(path, "memory.current")) as f:
        return int(f.read())


def test_implicit_children_are_charged_to_the_owners_memory_cgroup(pd, loopback, implicit, local):
    """Each 128 MiB of an implicit MR that a peer touches gets a child with a
    256 KiB page list, made in rxe's tasks, not in the owner's. It must be
    charged to the owner's memory cgroup, or a peer touching a sparse
    address space grows kernel memory no limit sees. 32 one-page mappings,
    128 MiB apart, one remote 1 KiB WRITE into each: the owner's cgroup
    grows by at least 3/4 of 32 page lists (8 MiB), not just by 32 pages."""
    regions = 32
    base = unmapped_space((regions + 1) * CHILD)
    pages = [mmap_anon(PAGE, addr=base + i * CHILD) for i in range(regions)]
    local.write(pattern(1024, 13), 1024)
    with memory_cgroup("odpwatch-children") as cg:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        try:
            before = cgroup_bytes(cg)
            for p in pages:
                assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 1024,
                                     implicit, p, timeout=120) == e.IBV_WC_SUCCESS
            grown = cgroup_bytes(cg) - before
            print(f"{regions} children: the owner's cgroup grew by {grown >> 10} KiB")
            assert_bytes(peek(pages[-1], 1024), pattern(1024, 13))
            assert grown >= regions * (256 << 10) * 3 // 4, \
                f"{grown >> 10} KiB charged for {regions} children of 256 KiB"
        finally:
            with open(os.path.join(CGROUP_ROOT, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            for p in pages:
                munmap(p, PAGE)


def rereg_error(mr, flags, pd=None, access=0):
    """The errno of an ibv_rereg_mr() that must fail (0 if it did not)."""
    try:
        mr.rereg(flags, pd, 0, 0, access)
    except Exception as err:  # PyverbsRDMAError
        return getattr(err, "error_code", -1)
    return 0


def test_rereg_keeps_the_kind_of_mr(pd):
    """ibv_rereg_mr() changes an MR's access in place (rxe's provider passes
    it to the kernel): it cannot turn a pinned MR into an on-demand one or
    back (mr->access would then say one thing and the umem another), nor
    give an implicit MR the FLUSH access its registration refuses. Each is
    EINVAL; so is persistent FLUSH access for a pinned MR whose pages were
    never checked to be persistent memory, and IBV_ACCESS_HUGETLB for a
    pinned MR (the flag describes an on-demand MR's pages; registration
    refuses it without ODP, and so must rereg). A change that keeps the kind
    succeeds, HUGETLB added to an ODP MR included."""
    buf = mmap_anon(LEN)
    mrs = []
    try:
        pinned = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE, address=buf)
        mrs.append(pinned)
        odp = MR(pd, LEN, ODP, address=buf)
        mrs.append(odp)
        whole = MR(pd, 0, ODP, implicit=True)
        mrs.append(whole)
        change = e.IBV_REREG_MR_CHANGE_ACCESS
        assert rereg_error(pinned, change, access=e.IBV_ACCESS_LOCAL_WRITE |
                           e.IBV_ACCESS_FLUSH_PERSISTENT) == errno.EINVAL
        assert rereg_error(pinned, change, access=e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_ON_DEMAND) \
            == errno.EINVAL
        assert rereg_error(odp, change, access=ODP & ~e.IBV_ACCESS_ON_DEMAND) == errno.EINVAL
        assert rereg_error(whole, change, access=ODP & ~e.IBV_ACCESS_ON_DEMAND) == errno.EINVAL
        for flush in (e.IBV_ACCESS_FLUSH_GLOBAL, e.IBV_ACCESS_FLUSH_PERSISTENT):
            assert rereg_error(whole, change, access=ODP | flush) == errno.EINVAL
        assert rereg_error(pinned, change, access=e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_HUGETLB) \
            == errno.EINVAL
        # What keeps the kind goes through.
        assert rereg_error(pinned, change, access=e.IBV_ACCESS_LOCAL_WRITE |
                           e.IBV_ACCESS_REMOTE_READ) == 0
        assert rereg_error(odp, change, access=ODP | e.IBV_ACCESS_FLUSH_GLOBAL) == 0
        assert rereg_error(odp, change, access=ODP | e.IBV_ACCESS_HUGETLB) == 0
        assert rereg_error(whole, change, access=ODP & ~e.IBV_ACCESS_REMOTE_ATOMIC) == 0
    finally:
        for mr in mrs:
            mr.close()
        munmap(buf, LEN)


@pytest.mark.parametrize("kind", ["explicit", "implicit"])
def test_rereg_access_of_an_odp_mr_takes_effect(ctx, pd, local, kind):
    """An ODP MR registered for local access only refuses a remote WRITE;
    re-registered with remote access, the next QP's WRITE faults its pages
    in and lands; re-registered without, it is refused again."""
    buf = mmap_anon(LEN)
    access = e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE
    mr = MR(pd, 0, access, implicit=True) if kind == "implicit" else MR(pd, LEN, access, address=buf)
    change = e.IBV_REREG_MR_CHANGE_ACCESS
    try:
        local.write(pattern(LEN, 21), LEN)
        for remote, want in ((False, e.IBV_WC_REM_ACCESS_ERR), (True, e.IBV_WC_SUCCESS),
                             (False, e.IBV_WC_REM_ACCESS_ERR)):
            mr.rereg(change, None, 0, 0, access | (e.IBV_ACCESS_REMOTE_WRITE if remote else 0))
            requester, responder = LoopbackQP.pair(ctx, pd)
            got = requester.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN, mr, buf)
            assert got == want, f"remote access {remote}: WRITE completed with status {got}"
            if want == e.IBV_WC_SUCCESS:
                assert_bytes(peek(buf, LEN), pattern(LEN, 21))
    finally:
        mr.close()
        munmap(buf, LEN)
