# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""Allocation-failure sweep of every memwatch and ODP operation a process can
start (libprovider/tests/failnth_sweep.cpp): the 1st, 2nd, ... kernel
allocation of each fails in turn through the task's fail-nth until the
operation gets through; every failure must give a clean errno and leave
nothing behind. Then what fail-nth cannot reach, rxe's work items: traffic
while failslab and fail_page_alloc fail 2% of the allocations made under
rxe's ODP code, a WRITE whose responder fault finds its first
allocations all failing, and a READ whose later responses do. Needs a kernel with fault injection (the debug kernel); the guest's
kmemleak scan after the run finds what a failure path leaked."""
import contextlib
import ctypes
import os
import re
import subprocess

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from conftest import (LoopbackQP, assert_bytes, hw_counter, madvise_dontneed, mmap_anon, munmap,
                      next_completion)

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
def test_allocation_failures(operation, record_testsuite_property):
    """An injected failure must give ENOMEM or EAGAIN, or be got over; EFAULT
    only where the operation faults user pages in (prefetch: hmm reports a
    failed page-table allocation as EFAULT). The sweep accepted EFAULT
    everywhere until 2026-11-28, which would hide a failure reported as a
    bad address. Each operation's errnos go into the JUnit XML, as
    properties of the suite."""
    r = subprocess.run([BINARY, operation], capture_output=True, text=True, timeout=1200)
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"^ok 1 .* # (\d+) allocations failed in turn.*", r.stdout, re.M)
    assert m, r.stdout
    # Per test properties are not in the xunit2 XML the runner writes.
    record_testsuite_property(f"sweep: {operation}", m.group(0))
    # An operation that allocates nothing would not test anything.
    assert int(m.group(1)) > 0, r.stdout


TRAFFIC = "/out/guest/bin/odpwatch-teardown"
DEBUGFS = "/sys/kernel/debug"


def rxe_odp_text():
    """The address range of rxe's ODP functions (rxe_odp.c):
    built in, they are the last stretch of rxe's .text. It ends where the next
    function after the last rxe_odp_/rxe_ib_advise_mr one starts."""
    text = []
    with open("/proc/kallsyms") as f:
        for line in f:
            addr, kind, name = line.split()[:3]
            if kind in "tT":
                text.append((int(addr, 16), name))
    text.sort()
    bounds = {name: addr for addr, name in text if name in ("_stext", "_etext")}
    odp = [i for i, (addr, name) in enumerate(text)
           if (name.startswith("rxe_odp_") or name == "rxe_ib_advise_mr") and
           bounds["_stext"] <= addr < bounds["_etext"]]
    assert odp and text[odp[0]][0], "no rxe ODP functions in /proc/kallsyms (root?)"
    return text[odp[0]][0], text[odp[-1] + 1][0]


def stacktrace_filter():
    return os.path.exists(os.path.join(DEBUGFS, "failslab", "require-start"))


@contextlib.contextmanager
def rxe_odp_allocation_failures(probability, times):
    """failslab and fail_page_alloc at @probability percent for every task,
    each for at most @times failures, but only for allocations with one of
    rxe's ODP functions on the stack: registration, child creation, the
    faults of the responder (queued and in place) and of prefetch, the fault
    and prefetch work items. Yields a function that counts the failures
    injected so far."""
    start, end = rxe_odp_text()
    knobs = {}
    try:
        for attr in ("failslab", "fail_page_alloc"):
            want = {"interval": "1", "times": str(times), "verbose": "0",
                    "task-filter": "N", "require-start": str(start),
                    "require-end": str(end), "ignore-gfp-wait": "N"}
            if attr == "fail_page_alloc":
                want.update({"min-order": "0", "ignore-gfp-highmem": "N"})
            want["probability"] = str(probability)  # last: the filter is in place by then
            for name, value in want.items():
                path = os.path.join(DEBUGFS, attr, name)
                with open(path) as f:
                    knobs[path] = f.read().strip()
                with open(path, "w") as f:
                    f.write(value)

        def injected():
            n = 0
            for attr in ("failslab", "fail_page_alloc"):
                with open(os.path.join(DEBUGFS, attr, "times")) as f:
                    n += times - int(f.read())
            return n

        yield injected
    finally:
        # Probability first: stop failing before the filter widens again.
        for path in sorted(knobs, key=lambda p: not p.endswith("probability")):
            with open(path, "w") as f:
                f.write(knobs[path])


needs_stacktrace_filter = pytest.mark.skipif(
    not (fault_injection() and stacktrace_filter()),
    reason="no failslab/require-start: kernel without CONFIG_FAULT_INJECTION_STACKTRACE_FILTER "
           "(the debug kernel has it)")


@needs_stacktrace_filter
def test_rxe_odp_under_failslab():
    """The faults fail-nth cannot reach: those in rxe's work items, at 2%.
    Every transfer must end with the right bytes or a clean error, failures
    must have been injected (or the test tested nothing), and some transfers
    must get through."""
    with rxe_odp_allocation_failures(2, 1000000) as count:
        r = subprocess.run([TRAFFIC, "tolerant", "32"], capture_output=True, text=True,
                           timeout=1200)
        injected = count()
    print(r.stdout, r.stderr, f"{injected} allocation failures injected")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"tolerant: 32 MiB, (\d+) written and checked", r.stdout)
    assert m, r.stdout
    assert injected > 0, "no allocation under rxe's ODP code was failed"
    assert int(m.group(1)) > 0, "nothing got through at 2% failures"


@needs_stacktrace_filter
def test_responder_fault_out_of_memory_is_retried(pd, loopback):
    """A responder fault that runs out of memory is transient: the WRITE is
    answered RNR again, not failed. The first allocations under rxe's ODP
    code all fail (the fault work's own, the pages, the page tables) until
    each knob's "times" is used up; the RDMA WRITE into untouched ODP memory
    must then complete with its bytes, and RNR NAKs must have covered the
    failures. (Before, the first failure was remembered as permanent and the
    retry's in-place fault, failing too, ended in IBV_WC_REM_ACCESS_ERR.)"""
    size, times = 64 << 10, 4
    src_buf, dst_buf = mmap_anon(size), mmap_anon(size)
    src = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=src_buf)   # pinned
    dst = MR(pd, size, e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE |
             e.IBV_ACCESS_REMOTE_WRITE, address=dst_buf)
    try:
        data = bytes((i * 13 + 5) & 0xFF for i in range(size))
        ctypes.memmove(src_buf, data, size)
        rnr0 = hw_counter("rcvd_rnr_err")
        with rxe_odp_allocation_failures(100, times) as count:
            status = loopback.rdma(e.IBV_WR_RDMA_WRITE, src, src_buf, size,
                                   dst, dst_buf, timeout=120)
            injected = count()
        rnr = hw_counter("rcvd_rnr_err") - rnr0
        print(f"{injected} allocation failures injected, {rnr} RNR NAKs, status {status}")
        assert status == e.IBV_WC_SUCCESS, f"WRITE ended with status {status}"
        assert_bytes(ctypes.string_at(dst_buf, size), data)
        assert injected >= times, f"only {injected} failures injected"
        assert rnr >= 2, f"{rnr} RNR NAKs for {injected} failed allocations"
    finally:
        dst.close()
        src.close()
        munmap(src_buf, size)
        munmap(dst_buf, size)


@needs_stacktrace_filter
def test_read_response_fault_out_of_memory_is_retried(ctx, pd):
    """A READ's responses are built in the responder's task after its check,
    and fault in place what an invalidation took since (a READ cannot be
    answered RNR once its responses began). Such a fault that runs out of
    memory is transient: the response is built again, not the READ failed.
    An 8 MiB ODP source, all present at registration; its second half
    dropped (MADV_DONTNEED) just before the READ, whose check then sees the
    first 4 MiB present and lets it through; the faults of the second half
    find their first allocations failing. The READ must complete with the
    first half's bytes and zeros after. (Before, the first failure ended the
    READ in a remote access error and the responder's QP in the error state.)"""
    size, times = 8 << 20, 4
    requester, _responder = LoopbackQP.pair(ctx, pd)
    src, dst = mmap_anon(size), mmap_anon(size)
    data = bytes((i * 31 + 7) & 0xFF for i in range(size // 2))
    ctypes.memmove(src, data, size // 2)
    ctypes.memset(src + size // 2, 0x77, size // 2)
    odp = MR(pd, size, e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE |
             e.IBV_ACCESS_REMOTE_READ, address=src)
    pinned = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=dst)
    try:
        with rxe_odp_allocation_failures(100, times) as count:
            madvise_dontneed(src + size // 2, size // 2)
            status = requester.rdma(e.IBV_WR_RDMA_READ, pinned, dst, size, odp, src,
                                    timeout=120)
            injected = count()
        print(f"{injected} allocation failures injected, status {status}")
        assert injected >= 1, "no allocation under rxe's ODP code was failed"
        assert status == e.IBV_WC_SUCCESS, f"READ ended with status {status}"
        got = ctypes.string_at(dst, size)
        assert_bytes(got[:size // 2], data, "first half")
        assert_bytes(got[size // 2:], bytes(size // 2), "second half (dropped: zeros)")
    finally:
        odp.close()
        pinned.close()
        munmap(src, size)
        munmap(dst, size)


FAIL_MAP = os.path.join(DEBUGFS, "fail_rxe_odp_map")


@contextlib.contextmanager
def fail_rxe_odp_map(times, nth=1):
    """rxe's fail_rxe_odp_map: @times mappings of an ODP access's pages, from
    the @nth from now on, fail as an invalidation racing with them would.
    (space counts the calls down afresh each time; interval's count would
    carry over from one use to the next.) Yields a function that counts the
    failures injected so far."""
    knobs = {}
    try:
        want = {"interval": "1", "times": str(times), "space": str(nth), "verbose": "0",
                "task-filter": "N", "probability": "100"}
        for name, value in want.items():
            path = os.path.join(FAIL_MAP, name)
            with open(path) as f:
                knobs[path] = f.read().strip()
            with open(path, "w") as f:
                f.write(value)

        def injected():
            with open(os.path.join(FAIL_MAP, "times")) as f:
                return times - int(f.read())

        yield injected
    finally:
        for path in sorted(knobs, key=lambda p: not p.endswith("probability")):
            with open(path, "w") as f:
                f.write(knobs[path])


@pytest.mark.skipif(not os.path.isdir(FAIL_MAP),
                    reason="no fail_rxe_odp_map: kernel without CONFIG_FAULT_INJECTION_DEBUG_FS "
                           "(the debug kernel runs this)")
@pytest.mark.parametrize("size", [64, 16 << 10], ids=["one-response", "several-responses"])
def test_first_read_response_built_again_is_the_first(ctx, pd, size):
    """The first response of an RDMA READ whose copy out of an ODP MR fails
    transiently is built again when the responder next runs (rxe review H2).
    It must still go out as the first (RESPONSE_ONLY or FIRST): built as
    LAST or MIDDLE, rxe's requester completed the READ as successful with
    its buffer never written, and warned. The source's pages are all
    present; fail_rxe_odp_map fails the first mapping, the READ's first
    copy. The READ must complete with the source's bytes."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    length = 64 << 10
    src, dst = mmap_anon(length), mmap_anon(length)
    data = bytes((i * 29 + 3) & 0xFF for i in range(size))
    ctypes.memmove(src, data, size)
    ctypes.memset(dst, 0xEE, length)
    odp = MR(pd, length, e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE |
             e.IBV_ACCESS_REMOTE_READ, address=src)
    pinned = MR(pd, length, e.IBV_ACCESS_LOCAL_WRITE, address=dst)
    try:
        with fail_rxe_odp_map(1) as injected:
            status = requester.rdma(e.IBV_WR_RDMA_READ, pinned, dst, size, odp, src,
                                    timeout=60)
            n = injected()
        assert n == 1, f"{n} mapping failures injected, not 1"
        assert status == e.IBV_WC_SUCCESS, f"READ ended with status {status}"
        assert_bytes(ctypes.string_at(dst, size), data)
    finally:
        odp.close()
        pinned.close()
        munmap(src, length)
        munmap(dst, length)


@pytest.mark.skipif(not os.path.isdir(FAIL_MAP),
                    reason="no fail_rxe_odp_map: kernel without CONFIG_FAULT_INJECTION_DEBUG_FS "
                           "(the debug kernel runs this)")
@pytest.mark.parametrize("op", ["fetch-add", "compare-swap"])
def test_atomic_survives_a_transient_fault(ctx, pd, op):
    """An atomic on an ODP MR whose pages are present but whose mapping
    fails as an invalidation racing with it would (rxe review M5): it has
    not been carried out, so the responder answers RNR and the requester
    sends it again, as for a WRITE, instead of ending both QPs with a
    remote access error. It is carried out once, on the right word."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    target = mmap_anon(4096)
    ctypes.memmove(target + 64, (40).to_bytes(8, "little"), 8)
    odp = MR(pd, 4096, e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE |
             e.IBV_ACCESS_REMOTE_ATOMIC, address=target)
    local = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    try:
        if op == "fetch-add":
            wr = SendWR(opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1,
                        sg=[SGE(local.buf, 8, local.lkey)])
            wr.set_wr_atomic(rkey=odp.rkey, addr=target + 64, compare_add=2, swap=0)
        else:
            wr = SendWR(opcode=e.IBV_WR_ATOMIC_CMP_AND_SWP, num_sge=1,
                        sg=[SGE(local.buf, 8, local.lkey)])
            wr.set_wr_atomic(rkey=odp.rkey, addr=target + 64, compare_add=40, swap=42)
        rnr = hw_counter("send_rnr_err")
        with fail_rxe_odp_map(1) as injected:
            requester.qp.post_send(wr)
            status = requester.wait(timeout=60)
            n = injected()
        assert n == 1, f"{n} mapping failures injected, not 1"
        assert status == e.IBV_WC_SUCCESS, f"the atomic ended with status {status}"
        assert int.from_bytes(local.read(8, 0), "little") == 40, "the old value"
        assert int.from_bytes(ctypes.string_at(target + 64, 8), "little") == 42, \
            "carried out once"
        assert hw_counter("send_rnr_err") > rnr, "no RNR NAK answered the failed mapping"
    finally:
        local.close()
        odp.close()
        munmap(target, 4096)


# How a 16 KiB receive is laid out (pieces of (offset, length, kind)), and
# which ODP mapping fail_rxe_odp_map fails: one packet of 1 KiB is one
# mapping of one ODP piece.
RECEIVES = {
    # the first packet, and a later one within the same SGE
    "one-sge-first-packet": ([(0, 16 << 10, "odp")], 1),
    "one-sge-fifth-packet": ([(0, 16 << 10, "odp")], 5),
    # the first packet of the second SGE: the failure is judged there
    "two-sges-ninth-packet": ([(0, 8 << 10, "odp"), (8 << 10, 8 << 10, "odp")], 9),
    # packet 5 fills the pinned SGE's last 512 bytes, then fails in the ODP
    # one: sent again, it must start in the pinned SGE again
    "pinned-then-odp-straddling": ([(0, 4608, "pinned"), (4608, 11776, "odp")], 1),
}


@pytest.mark.skipif(not os.path.isdir(FAIL_MAP),
                    reason="no fail_rxe_odp_map: kernel without CONFIG_FAULT_INJECTION_DEBUG_FS "
                           "(the debug kernel runs this)")
@pytest.mark.parametrize("receive", RECEIVES)
@pytest.mark.parametrize("queue", ["rq", "srq"])
def test_send_into_an_odp_receive_buffer_survives_a_transient_fault(ctx, pd, queue, receive):
    """A SEND of 16 KiB (16 packets at MTU 1024) into a receive whose ODP
    pages are all present; fail_rxe_odp_map fails one packet's copy, as a
    fault colliding with invalidations does. The responder must answer that
    packet RNR and take it when it comes again, from where it found the
    receive, as it does for a WRITE; it ended the QP instead (the receive
    completed with a local QP operation error). On an SRQ the receive taken
    for the first packet serves the packet sent again: the next receive
    stays posted, and takes the next SEND."""
    pieces, nth = RECEIVES[receive]
    length = 16 << 10
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=2))) if queue == "srq" else None
    sender, receiver = LoopbackQP.pair(ctx, pd, srq=srq)
    src, dst = mmap_anon(length), mmap_anon(length)
    data = bytes((i * 13 + 5) & 0xFF for i in range(length))
    ctypes.memmove(src, data, length)
    ctypes.memset(dst, 0xEE, length)  # present: only the injected failure faults
    mrs = [MR(pd, length, e.IBV_ACCESS_LOCAL_WRITE, address=src)]
    sges = []
    for offset, size, kind in pieces:
        access = e.IBV_ACCESS_LOCAL_WRITE | (e.IBV_ACCESS_ON_DEMAND if kind == "odp" else 0)
        mrs.append(MR(pd, size, access, address=dst + offset))
        sges.append(SGE(dst + offset, size, mrs[-1].lkey))
    post_recv = srq.post_recv if srq else receiver.qp.post_recv
    try:
        for wr_id in (1, 2):
            post_recv(RecvWR(wr_id=wr_id, num_sge=len(sges), sg=sges))
        rnr_naks = hw_counter("send_rnr_err")
        with fail_rxe_odp_map(1, nth=nth) as injected:
            sender.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1,
                                       sg=[SGE(src, length, mrs[0].lkey)]))
            sent = sender.wait(timeout=60)
            n = injected()
        assert n == 1, f"{n} mapping failures injected, not 1"
        got = next_completion(receiver.cq)
        assert (sent, got.status) == (e.IBV_WC_SUCCESS, e.IBV_WC_SUCCESS), \
            f"SEND ended with status {sent}, its receive with {got.status}"
        assert (got.wr_id, got.byte_len) == (1, length), (got.wr_id, got.byte_len)
        assert hw_counter("send_rnr_err") > rnr_naks, "the packet was not answered RNR"
        assert_bytes(ctypes.string_at(dst, length), data)
        # The second receive is still posted and takes the next SEND.
        sender.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1,
                                   sg=[SGE(src, 64, mrs[0].lkey)]))
        assert sender.wait(timeout=30) == e.IBV_WC_SUCCESS
        got = next_completion(receiver.cq)
        assert (got.status, got.wr_id, got.byte_len) == (e.IBV_WC_SUCCESS, 2, 64), \
            (got.status, got.wr_id, got.byte_len)
    finally:
        for mr in mrs:
            mr.close()
        munmap(src, length)
        munmap(dst, length)
