# SPDX-License-Identifier: GPL-2.0
"""UD on rxe as middleware uses it: a receive starts with the 40-byte GRH
area, which for RoCE v2 over IPv4 holds the packet's IPv4 header in its
last 20 bytes (IBTA A17.4.5.2). UCX checks the destination address there
and drops a packet not meant for its GID (UCX_UD_VERBS_ETH_DGID_CHECK)."""
import ipaddress
import time

import pyverbs.enums as e
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from conftest import RDMA_DEV, roce_v2_ipv4_gid

QKEY = 0x1ee7a330
GRH = 40
PAYLOAD = 64


def poll(cq, n, timeout=30.0):
    """The next @n completions."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        k, wcs = cq.poll(num_entries=n - len(got))
        got += wcs[:k]
        if not k:
            time.sleep(0.0005)
    assert len(got) == n, f"{len(got)} of {n} completions"
    return got


def test_ud_receive_holds_the_ipv4_header(ctx, pd):
    port = 1
    index, gid = roce_v2_ipv4_gid(RDMA_DEV, port)
    addr = ipaddress.IPv6Address(gid).ipv4_mapped.packed
    cq = CQ(ctx, 8)
    init = QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                      cap=QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1))
    attr = QPAttr(port_num=port)
    attr.qkey = QKEY
    qp = QP(pd, init, attr)  # a UD QP given attr goes to RTS
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    mr.write(b"\xee" * 1024, 1024, 0)
    mr.write(bytes(range(PAYLOAD)), PAYLOAD, 2048)
    qp.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf, GRH + PAYLOAD, mr.lkey)]))
    ah = AH(pd, attr=AHAttr(port_num=port, is_global=1,
                            gr=GlobalRoute(dgid=ctx.query_gid(port, index), sgid_index=index)))
    wr = SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(mr.buf + 2048, PAYLOAD, mr.lkey)])
    wr.set_wr_ud(ah, qp.qp_num, QKEY)
    qp.post_send(wr)
    wcs = {wc.wr_id: wc for wc in poll(cq, 2)}
    assert wcs[2].status == e.IBV_WC_SUCCESS
    recv = wcs[1]
    assert recv.status == e.IBV_WC_SUCCESS
    assert recv.wc_flags & e.IBV_WC_GRH
    assert recv.byte_len == GRH + PAYLOAD
    area = mr.read(GRH + PAYLOAD, 0)
    ip = area[20:GRH]
    assert area[:20] == bytes(20), f"bytes 0-19 of the GRH area: {area[:20].hex()}"
    assert ip[0] >> 4 == 4 and ip[0] & 0xf == 5, f"not an IPv4 header: {ip.hex()}"
    assert ip[9] == 17, f"IPv4 protocol {ip[9]}, not UDP"
    assert ip[12:16] == addr and ip[16:20] == addr, \
        f"source {ip[12:16].hex()}, destination {ip[16:20].hex()}, want {addr.hex()}"
    assert area[GRH:] == bytes(range(PAYLOAD))
