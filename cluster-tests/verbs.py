# SPDX-License-Identifier: GPL-2.0
"""What both nodes of the cluster suite use: memory, MRs of each kind and an
RC QP connected to a QP on the other node (by its number and RoCE v2 GID)."""
import os
import sys
import time
from pathlib import Path

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

# Memory, byte comparison and the GID lookup: the pyverbs tests' own.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pyverbs-tests"))
from rxe_env import (assert_bytes, madvise_dontneed, mmap_anon,  # noqa: E402,F401
                     mr_counters, munmap, roce_v2_ipv4_gid)

RDMA_DEV = os.environ.get("RDMA_DEV", "rxe0")
PORT = 18600            # the agent's RPC port on node 1 (perftest takes 18515)
AUTHKEY = b"odpwatch-cluster"

REMOTE = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ |
          e.IBV_ACCESS_REMOTE_ATOMIC)
MODES = ("pinned", "odp", "implicit")


def pattern(seed, length):
    """Bytes that differ from one seed (and one offset) to the next."""
    return bytes((seed * 131 + i * 7 + (i >> 12)) & 0xFF for i in range(length))


def register(pd, mode, addr, length):
    """An MR of @mode (pinned, odp, implicit) that reaches [addr, addr + length)."""
    if mode == "pinned":
        return MR(pd, length, REMOTE, address=addr)
    if mode == "odp":
        return MR(pd, length, REMOTE | e.IBV_ACCESS_ON_DEMAND, address=addr)
    if mode == "implicit":
        return MR(pd, 0, REMOTE | e.IBV_ACCESS_ON_DEMAND, implicit=True)
    raise ValueError(mode)


class RemoteQP:
    """An RC QP to be connected to a QP of the other node."""

    def __init__(self, ctx, pd, depth=64):
        self.cq = CQ(ctx, 2 * depth)
        cap = QPCap(max_send_wr=depth, max_recv_wr=depth, max_send_sge=1, max_recv_sge=1)
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = REMOTE
        self.qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap), attr)
        self.attr = attr
        self.gid_index, self.gid = roce_v2_ipv4_gid(RDMA_DEV)

    @property
    def qpn(self):
        return self.qp.qp_num

    def connect(self, qpn, gid, retry_cnt=7, timeout=14):
        """To RTS towards QP @qpn at RoCE v2 GID @gid (a string). retry_cnt 7
        is perftest's, UCX's and libfabric's default; unpatched rxe retried
        it for ever (kernel-patches/0016), so a QP that must see its peer
        vanish uses 6. timeout 14 (67 ms a try) is rdma_cm's."""
        a = self.attr
        a.ah_attr = AHAttr(port_num=1, is_global=1,
                           gr=GlobalRoute(dgid=GID(gid), sgid_index=self.gid_index))
        a.path_mtu = e.IBV_MTU_4096
        a.max_dest_rd_atomic = a.max_rd_atomic = 4
        a.min_rnr_timer = 12
        a.timeout, a.retry_cnt, a.rnr_retry = timeout, retry_cnt, 7
        a.rq_psn = a.sq_psn = 0
        a.dest_qp_num = qpn
        self.qp.to_rts(a)

    def poll(self, timeout=60.0):
        """The next completion's status (TimeoutError if none comes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n, wcs = self.cq.poll()
            if n:
                return wcs[0].status
            time.sleep(0.0005)
        raise TimeoutError("no completion")

    def post_recv(self, mr, addr, length):
        self.qp.post_recv(RecvWR(num_sge=1, sg=[SGE(addr, length, mr.lkey)]))

    def rdma(self, opcode, mr, addr, length, rkey, raddr, signaled=True):
        wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(addr, length, mr.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED if signaled else 0)
        wr.set_wr_rdma(rkey, raddr)
        self.qp.post_send(wr)

    def send(self, mr, addr, length):
        self.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(addr, length, mr.lkey)]))

    def fetch_add(self, mr, addr, rkey, raddr, add):
        wr = SendWR(opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1, sg=[SGE(addr, 8, mr.lkey)])
        wr.set_wr_atomic(rkey=rkey, addr=raddr, compare_add=add, swap=0)
        self.qp.post_send(wr)


