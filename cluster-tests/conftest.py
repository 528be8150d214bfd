# SPDX-License-Identifier: GPL-2.0
"""Fixtures of the cluster suite, run on node 0: the local device, and the
agent on node 1 (agent.py), reached over the wire by RPC."""
import contextlib
import multiprocessing.connection as mpc
import os
import time

import pytest
from pyverbs.device import Context
from pyverbs.pd import PD

import verbs

PEER = os.environ.get("ODPWATCH_PEER", "198.51.100.11")


class Peer:
    """Calls to the agent on node 1: peer.mem("odp", n) runs Agent.mem there."""

    def __init__(self, conn):
        self.conn = conn

    def __getattr__(self, name):
        def call(*args):
            self.conn.send((name, args))
            status, value = self.conn.recv()
            if status != "ok":
                raise RuntimeError(f"on node 1: {value}")
            return value
        return call


@pytest.fixture(scope="session")
def peer():
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = mpc.Client((PEER, verbs.PORT), authkey=verbs.AUTHKEY)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    p = Peer(conn)
    yield p
    p.shutdown()
    conn.close()


@pytest.fixture(scope="session")
def ctx():
    with Context(name=verbs.RDMA_DEV) as c:
        yield c


@pytest.fixture(scope="session")
def pd(ctx):
    with PD(ctx) as p:
        yield p


@pytest.fixture
def qp(ctx, pd, peer):
    """A local RC QP connected to one on node 1: (local, peer's handle)."""
    with remote_pair(ctx, pd, peer) as pair:
        yield pair


@contextlib.contextmanager
def remote_pair(ctx, pd, peer, **connect_args):
    """The qp fixture's pair, with the local QP's connect() arguments."""
    local = verbs.RemoteQP(ctx, pd)
    remote = peer.qp()
    peer.connect(remote["h"], local.qpn, local.gid)
    local.connect(remote["qpn"], remote["gid"], **connect_args)
    try:
        yield local, remote["h"]
    finally:
        try:
            peer.close(remote["h"])
        except RuntimeError:
            pass  # the test destroyed it already
        local.qp.close()
        local.cq.close()


@pytest.fixture
def local_mem(pd):
    """Pinned local buffers: local_mem(length) -> (addr, mr)."""
    made = []

    def make(length):
        addr = verbs.mmap_anon(length)
        mr = verbs.register(pd, "pinned", addr, length)
        made.append((addr, length, mr))
        return addr, mr
    yield make
    for addr, length, mr in made:
        mr.close()
        verbs.munmap(addr, length)
