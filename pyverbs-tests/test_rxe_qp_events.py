# SPDX-License-Identifier: GPL-2.0
"""An error on a QP of an SRQ must reach the responder's application
(C9-222.1), and a receive it took from the SRQ must complete, flushed, when
the QP goes to the error state. (The other two rules an RDMA library's
teardown relies on, one Last WQE Reached event per entry into the error
state and a retry count of 7 that runs out, are kselftests of the rdma
fixes: rxe_odp_data's fix_* cases, run on the vanilla base too.)"""
import contextlib
import ctypes
import time

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.qp import QPAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

from conftest import (LoopbackQP, async_events, hw_counter, mmap_anon, munmap, next_completion,
                      odp_mr_past_a_files_end)


@pytest.fixture
def local(pd):
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    yield mr
    mr.close()


REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


@contextlib.contextmanager
def write_target(pd, kind):
    """An MR a WRITE with immediate fails on, and the (rkey, address) that
    makes it fail: @kind names how (review M1: every error of the
    responder's checks and copy, pinned or ODP)."""
    if kind == "copy-failure":  # past the file's end no page can come in
        with odp_mr_past_a_files_end(pd, 16384, REMOTE | e.IBV_ACCESS_ON_DEMAND) as (buf, mr):
            yield mr.rkey, buf + 8192
        return
    odp = kind.startswith("odp-")
    mr = MR(pd, 4096, REMOTE | (e.IBV_ACCESS_ON_DEMAND if odp else 0))
    try:
        if kind.endswith("bad-rkey"):
            yield mr.rkey ^ 1, mr.buf
        else:  # length: 64 bytes from 32 before the MR's end
            yield mr.rkey, mr.buf + 4096 - 32
    finally:
        mr.close()


@pytest.mark.parametrize("kind", ["bad-rkey", "length", "odp-bad-rkey", "odp-length",
                                  "copy-failure"])
@pytest.mark.parametrize("receives", [1, 0], ids=["srq-with-a-receive", "srq-empty"])
def test_write_with_imm_error_on_an_srq_reaches_the_responder(ctx, pd, local, receives, kind):
    """C9-222.1: a responder's error must reach its application, in a
    completion of the receive the request would have consumed or, when it
    has none, as an async event. A WRITE with immediate takes its receive
    from an SRQ only after the rkey and length checks (an ODP fault there
    answers RNR and a receive taken from an SRQ cannot be given back): a
    bad rkey then completed nothing and raised nothing, and the responder's
    QP went to the error state silently (review M1). The same for a length
    beyond the MR and a copy that fails for good, pinned and ODP."""
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))
    sender, receiver = LoopbackQP.pair(ctx, pd, srq=srq)
    sink = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    for i in range(receives):
        srq.post_recv(RecvWR(wr_id=70 + i, num_sge=1, sg=[SGE(sink.buf, 64, sink.lkey)]))
    assert async_events(ctx, 0) == [], "events before the test"

    with write_target(pd, kind) as (rkey, addr):
        wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, imm_data=0x1234,
                    sg=[SGE(local.buf, 64, local.lkey)])
        wr.set_wr_rdma(rkey, addr)
        sender.qp.post_send(wr)
        assert sender.wait(timeout=60) == e.IBV_WC_REM_ACCESS_ERR

        events = async_events(ctx, 2)
        if receives:
            try:
                status = receiver.wait(timeout=10)
            except TimeoutError:
                pytest.fail(f"no completion on the responder (async events: {events})")
            assert status == e.IBV_WC_REM_ACCESS_ERR, status
            assert e.IBV_EVENT_QP_ACCESS_ERR not in events, events
        else:
            assert e.IBV_EVENT_QP_ACCESS_ERR in events, \
                f"no completion to carry the error and no access error event: {events}"
    sink.close()


def test_srq_receive_held_across_an_rnr_nak_is_flushed_with_the_qp(ctx, pd):
    """A SEND's first packet into an SRQ receive of untouched ODP memory is
    answered RNR (its fault queued) and the receive it took is held for the
    packet sent again. The sender gives up at once (rnr_retry 0); when the
    receiving QP then goes to the error state, that receive must complete,
    flushed, as every receive a QP took does, not vanish from the
    application's pool; the SRQ's other receive stays there."""
    length = 16 << 10
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))
    sender = LoopbackQP(ctx, pd, connect=False)
    receiver = LoopbackQP(ctx, pd, connect=False, srq=srq)
    sender.attr.rnr_retry = 0
    sender.connect(receiver.qp.qp_num)
    receiver.connect(sender.qp.qp_num)
    src, dst = mmap_anon(length), mmap_anon(length)
    pinned = MR(pd, length, e.IBV_ACCESS_LOCAL_WRITE, address=src)
    odp = MR(pd, length, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_ON_DEMAND, address=dst)
    try:
        for wr_id in (1, 2):
            srq.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(dst, length, odp.lkey)]))
        sender.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1,
                                   sg=[SGE(src, length, pinned.lkey)]))
        assert sender.wait(timeout=60) == e.IBV_WC_RNR_RETRY_EXC_ERR
        receiver.qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
        got = next_completion(receiver.cq, timeout=10)
        assert (got.wr_id, got.status) == (1, e.IBV_WC_WR_FLUSH_ERR), (got.wr_id, got.status)
        n, _ = receiver.cq.poll()
        assert n == 0, "the SRQ's other receive was flushed too"
    finally:
        odp.close()
        pinned.close()
        munmap(src, length)
        munmap(dst, length)


@pytest.mark.parametrize("odp", [False, True], ids=["pinned", "odp"])
def test_write_with_imm_into_an_empty_srq_lands_once_a_receive_comes(ctx, pd, odp):
    """An RDMA WRITE with immediate of ten packets into a QP whose SRQ is
    empty: its last packet writes its data, finds no receive and is answered
    RNR, and gives its progress back; sent again once a receive is posted,
    it writes the same bytes at the same place. Every byte where it belongs,
    none beyond, one receive taken with the immediate."""
    length, offset, size = 10000, 100, 16 << 10
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))
    sender, receiver = LoopbackQP.pair(ctx, pd, srq=srq)
    src, dst = mmap_anon(size), mmap_anon(size)
    data = bytes((i * 11 + 5) & 0xFF for i in range(length))
    ctypes.memmove(src, data, length)
    pinned = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=src)
    target = MR(pd, size, REMOTE | (e.IBV_ACCESS_ON_DEMAND if odp else 0), address=dst)
    sink = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    try:
        rnr0 = hw_counter("rcvd_rnr_err")
        wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1,
                    sg=[SGE(src, length, pinned.lkey)], imm_data=7)
        wr.set_wr_rdma(target.rkey, dst + offset)
        sender.qp.post_send(wr)
        deadline = time.monotonic() + 30
        while hw_counter("rcvd_rnr_err") == rnr0:
            assert time.monotonic() < deadline, "no RNR NAK while the SRQ was empty"
        # Past any fault of the ODP pages: the last packet has met the
        # empty SRQ, again and again.
        time.sleep(1)
        n, _ = receiver.cq.poll()
        assert n == 0, "a completion with no receive posted"
        srq.post_recv(RecvWR(wr_id=5, num_sge=1, sg=[SGE(sink.buf, 64, sink.lkey)]))
        assert sender.wait(timeout=30) == e.IBV_WC_SUCCESS
        got = next_completion(receiver.cq, timeout=30)
        assert (got.wr_id, got.status, got.opcode) == (5, e.IBV_WC_SUCCESS,
                                                       e.IBV_WC_RECV_RDMA_WITH_IMM)
        assert got.imm_data in (7, 7 << 24), got.imm_data  # as it came off the wire, or not
        assert ctypes.string_at(dst + offset, length) == data, "the data is not where it went"
        assert ctypes.string_at(dst, offset) == bytes(offset), "bytes before it changed"
        rest = size - offset - length
        after = ctypes.string_at(dst + offset + length, rest)
        assert after == bytes(rest), "bytes after it changed"
    finally:
        sink.close()
        target.close()
        pinned.close()
        munmap(src, size)
        munmap(dst, size)
