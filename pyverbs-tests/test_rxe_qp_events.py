# SPDX-License-Identifier: GPL-2.0
"""What an RDMA library's teardown relies on from an RC QP: UCX, for one,
moves a QP on an SRQ to the error state, waits for its Last WQE Reached
event and asserts it comes once; and requests to a peer that went away
must end with RETRY_EXC_ERR, not be retried for ever; and an error on a
QP of an SRQ must reach the responder's application (C9-222.1)."""
import time

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.qp import QPAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

from conftest import LoopbackQP, async_events

SENDS = 4


@pytest.fixture
def local(pd):
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    yield mr
    mr.close()


def to_error(qp):
    qp.qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)


def last_wqe_events(ctx, seconds):
    events = async_events(ctx, seconds)
    others = [ev for ev in events if ev != e.IBV_EVENT_QP_LAST_WQE_REACHED]
    assert not others, f"unexpected events {others}"
    return len(events)


def test_last_wqe_reached_once_per_entry_into_the_error_state(ctx, pd, local):
    """o11-5.2.5: a QP on an SRQ that enters the error state gets one Last
    WQE Reached event. Packets its peer still sends (here SENDs, retried
    until the peer's retry count runs out) each run the responder again,
    and another move to the error state runs it too: none of them may raise
    the event a second time (UCX asserts on a second one). After RESET and
    back to RTS, the next entry into the error state gets its own event."""
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=SENDS, max_sge=1)))
    sender = LoopbackQP(ctx, pd, connect=False)
    sender.attr.retry_cnt = 2  # the error state answers nothing: let it give up
    receiver = LoopbackQP(ctx, pd, connect=False, srq=srq)
    sender.connect(receiver.qp.qp_num)
    receiver.connect(sender.qp.qp_num)
    assert async_events(ctx, 0) == [], "events before the test"

    to_error(receiver)
    assert last_wqe_events(ctx, 2) == 1, "entering the error state"

    for i in range(SENDS):
        sender.qp.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1,
                                   sg=[SGE(local.buf, 64, local.lkey)]))
    statuses = [sender.wait(timeout=60) for _ in range(SENDS)]
    assert statuses[0] == e.IBV_WC_RETRY_EXC_ERR, statuses
    n = last_wqe_events(ctx, 2)
    assert n == 0, f"{n} more Last WQE Reached events for packets that arrived in the error state"

    to_error(receiver)
    n = last_wqe_events(ctx, 2)
    assert n == 0, f"{n} more Last WQE Reached events for a move from the error state to it"

    receiver.qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)
    receiver.connect(sender.qp.qp_num)
    to_error(receiver)
    assert last_wqe_events(ctx, 2) == 1, "entering the error state again after RESET"


def test_retry_count_7_is_seven_retries_not_forever(ctx, pd, local):
    """A request its peer never acknowledges completes with RETRY_EXC_ERR
    once the transport retry count runs out, 7 included: only the RNR retry
    count gives 7 the meaning "infinite". 7 is what perftest, UCX and
    libfabric ask for; MPICH over UCX hung in MPI_Finalize on rxe when the
    other rank had closed its QPs first."""
    sender = LoopbackQP(ctx, pd, connect=False)
    assert sender.attr.retry_cnt == 7 and sender.attr.timeout == 14  # 8 x 67 ms
    receiver = LoopbackQP(ctx, pd, connect=False)
    sender.connect(receiver.qp.qp_num)
    receiver.connect(sender.qp.qp_num)
    to_error(receiver)  # answers nothing, as a peer that went away
    sender.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                               sg=[SGE(local.buf, 64, local.lkey)]))
    start = time.monotonic()
    try:
        status = sender.wait(timeout=30)
    except TimeoutError:
        pytest.fail("no completion in 30 s: retry_cnt 7 retried for ever")
    assert status == e.IBV_WC_RETRY_EXC_ERR, status
    print(f"RETRY_EXC_ERR after {time.monotonic() - start:.2f} s")


@pytest.mark.parametrize("receives", [1, 0], ids=["srq-with-a-receive", "srq-empty"])
def test_write_with_imm_error_on_an_srq_reaches_the_responder(ctx, pd, local, receives):
    """C9-222.1: a responder's error must reach its application, in a
    completion of the receive the request would have consumed or, when it
    has none, as an async event. A WRITE with immediate takes its receive
    from an SRQ only after the rkey and length checks (an ODP fault there
    answers RNR and a receive taken from an SRQ cannot be given back): a
    bad rkey then completed nothing and raised nothing, and the responder's
    QP went to the error state silently (review M1)."""
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1)))
    sender, receiver = LoopbackQP(ctx, pd, connect=False), LoopbackQP(ctx, pd, connect=False,
                                                                      srq=srq)
    sender.connect(receiver.qp.qp_num)
    receiver.connect(sender.qp.qp_num)
    dst = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    for i in range(receives):
        srq.post_recv(RecvWR(wr_id=70 + i, num_sge=1, sg=[SGE(dst.buf, 64, dst.lkey)]))
    assert async_events(ctx, 0) == [], "events before the test"

    wr = SendWR(opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, imm_data=0x1234,
                sg=[SGE(local.buf, 64, local.lkey)])
    wr.set_wr_rdma(dst.rkey ^ 1, dst.buf)
    sender.qp.post_send(wr)
    assert sender.wait(timeout=30) == e.IBV_WC_REM_ACCESS_ERR

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
