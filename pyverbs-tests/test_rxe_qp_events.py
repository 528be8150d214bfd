# SPDX-License-Identifier: GPL-2.0
"""An error on a QP of an SRQ must reach the responder's application
(C9-222.1). (The other two rules an RDMA library's teardown relies on, one
Last WQE Reached event per entry into the error state and a retry count of
7 that runs out, are kselftests of the rdma fixes: rxe_odp_data's fix_*
cases, run on the vanilla base too.)"""
import pytest
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

from conftest import LoopbackQP, async_events


@pytest.fixture
def local(pd):
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    yield mr
    mr.close()


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
