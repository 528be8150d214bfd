#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
"""A process on node 1 that holds an RC QP and a pinned MR for node 0 and
is then killed (agent.py's victim_* calls): its peer must see an error
completion, and both kernels carry on. Protocol on stdin/stdout, one JSON
line each way: it says its QP, GID, rkey and buffer; it is told the peer's
QP and GID; it says "ready" and waits to be killed."""
import json
import sys

from pyverbs.device import Context
from pyverbs.pd import PD

import verbs

LEN = 256 << 10

ctx = Context(name=verbs.RDMA_DEV)
pd = PD(ctx)
qp = verbs.RemoteQP(ctx, pd)
addr = verbs.mmap_anon(LEN)
mr = verbs.register(pd, "pinned", addr, LEN)
print(json.dumps({"qpn": qp.qpn, "gid": qp.gid, "rkey": mr.rkey, "addr": addr}), flush=True)
peer = json.loads(sys.stdin.readline())
qp.connect(peer["qpn"], peer["gid"])
print(json.dumps("ready"), flush=True)
sys.stdin.readline()  # never comes: the agent kills this process
