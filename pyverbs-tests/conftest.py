# SPDX-License-Identifier: GPL-2.0
"""Fixtures for odpwatch's pyverbs tests: the rxe device and a loopback RC QP."""
import contextlib
import os
import subprocess
import time

import pytest
import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from pyverbs.wr import RecvWR, SGE, SendWR

# Shared with cluster-tests/ (re-exported: the tests import them from here).
from rxe_env import (MADV_DONTNEED, MADV_NOHUGEPAGE, MAP_ANONYMOUS, MAP_FAILED,  # noqa: F401
                     MAP_FIXED_NOREPLACE, MAP_HUGETLB, MAP_PRIVATE, PROT_RW, assert_bytes, libc,
                     madvise, madvise_dontneed, mmap_anon, munmap, roce_v2_ipv4_gid)

RDMA_DEV = os.environ.get("RDMA_DEV", "rxe0")


def roce_v2_ipv4_gid_index(dev, port=1):
    """The index of the first RoCE v2 GID with an IPv4-mapped address."""
    return roce_v2_ipv4_gid(dev, port)[0]


def next_completion(cq, timeout=30.0):
    """The next work completion of @cq, whole."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n, wcs = cq.poll()
        if n:
            return wcs[0]
        time.sleep(0.0005)
    raise TimeoutError("no completion")


class LoopbackQP:
    """An RC QP connected to itself (or, with pair(), two connected to each
    other): RDMA goes through the whole transport."""

    def __init__(self, ctx, pd, port=1, connect=True, srq=None, flush=False):
        """connect=False leaves the QP in INIT, for connect() to another;
        srq: the shared receive queue its receives come from; flush: an
        extended QP that posts and accepts RDMA FLUSH (see flush())."""
        self.cq = CQ(ctx, 16)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=2)
        attr = QPAttr(port_num=port)
        attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                                e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
        if flush:
            attr.qp_access_flags |= e.IBV_ACCESS_FLUSH_GLOBAL | e.IBV_ACCESS_FLUSH_PERSISTENT
            init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                                srq=srq, pd=pd,
                                comp_mask=(e.IBV_QP_INIT_ATTR_PD |
                                           e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS),
                                send_ops_flags=(e.IBV_QP_EX_WITH_FLUSH |
                                                e.IBV_QP_EX_WITH_RDMA_WRITE))
            self.qp = QPEx(ctx, init, attr)
        else:
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, srq=srq)
            self.qp = QP(pd, init, attr)
        gid_index = roce_v2_ipv4_gid_index(RDMA_DEV, port)
        gr = GlobalRoute(dgid=ctx.query_gid(port, gid_index), sgid_index=gid_index)
        attr.ah_attr = AHAttr(port_num=port, is_global=1, gr=gr)
        attr.path_mtu = e.IBV_MTU_1024
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.rq_psn = attr.sq_psn = 0
        self.attr = attr
        if connect:
            self.connect(self.qp.qp_num)

    def connect(self, dest_qp_num):
        """Bring the QP to RTS towards QP @dest_qp_num of the same device."""
        self.attr.dest_qp_num = dest_qp_num
        self.qp.to_rts(self.attr)

    @classmethod
    def pair(cls, ctx, pd, srq=None):
        """Two QPs connected to each other: a responder's error (which moves
        it to the error state) then cannot flush the requester's request
        before the NAK completes it, as it may on a QP connected to itself.
        srq: the shared receive queue the second one's receives come from."""
        a, b = cls(ctx, pd, connect=False), cls(ctx, pd, connect=False, srq=srq)
        a.connect(b.qp.qp_num)
        b.connect(a.qp.qp_num)
        return a, b

    def wait(self, timeout=30.0):
        """The status of the next completion."""
        return next_completion(self.cq, timeout).status

    def rdma(self, opcode, src_mr, src_addr, length, dst_mr, dst_addr, timeout=30.0):
        """Post one signaled RDMA WRITE or READ and return its completion status."""
        wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(src_addr, length, src_mr.lkey)])
        wr.set_wr_rdma(dst_mr.rkey, dst_addr)
        self.qp.post_send(wr)
        return self.wait(timeout)

    def flush(self, mr, addr, length, ptype, level, timeout=120.0):
        """Post one signaled RDMA FLUSH (a QP made with flush=True) and return
        its completion status."""
        self.qp.wr_start()
        self.qp.wr_id = 1
        self.qp.wr_flags = e.IBV_SEND_SIGNALED
        self.qp.wr_flush(mr.rkey, addr, length, ptype, level)
        self.qp.wr_complete()
        return self.wait(timeout)

    def fetch_add(self, local_mr, local_addr, dst_mr, dst_addr, add):
        """Atomic fetch-and-add of @add at dst_addr; the old value lands at local_addr."""
        wr = SendWR(opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1,
                    sg=[SGE(local_addr, 8, local_mr.lkey)])
        wr.set_wr_atomic(rkey=dst_mr.rkey, addr=dst_addr, compare_add=add, swap=0)
        self.qp.post_send(wr)
        return self.wait()

    def send_recv(self, src_mr, src_addr, dst_mr, dst_addr, length):
        """SEND length bytes to a posted receive; returns (send, recv) statuses."""
        self.qp.post_recv(RecvWR(num_sge=1, sg=[SGE(dst_addr, length, dst_mr.lkey)]))
        self.qp.post_send(SendWR(opcode=e.IBV_WR_SEND, num_sge=1,
                                 sg=[SGE(src_addr, length, src_mr.lkey)]))
        return self.wait(), self.wait()


MAP_SHARED = 0x01


@contextlib.contextmanager
def odp_mr_past_a_files_end(pd, length, access):
    """An ODP MR (@access) over @length bytes of a shared mapping of a 4 KiB
    memfd: from offset 4096 on, its pages can never be faulted in. Yields
    (buf, mr)."""
    fd = os.memfd_create("odp-past-eof")
    buf = None
    try:
        os.ftruncate(fd, 4096)
        buf = libc.mmap(None, length, PROT_RW, MAP_SHARED, fd, 0)
        assert buf not in (None, MAP_FAILED)
        mr = MR(pd, length, access, address=buf)
        try:
            yield buf, mr
        finally:
            mr.close()
    finally:
        if buf:
            munmap(buf, length)
        os.close(fd)


def hw_counter(name):
    """A port hw counter of the device; the core caches them for 10 ms."""
    time.sleep(0.02)
    with open(f"/sys/class/infiniband/{RDMA_DEV}/ports/1/hw_counters/{name}") as f:
        return int(f.read())


def _event_fds_nonblocking():
    """Make the async event fds (anon_inode:[infinibandevent]: every
    context's, the test's among them) non-blocking, so that waiting for an
    event that never comes cannot hang a test."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[infinibandevent]":
                fds.append(int(fd))
        except OSError:  # the listing's own fd, gone by now
            pass
    assert fds, "no async event fd"
    for fd in fds:
        os.set_blocking(fd, False)


def async_events(ctx, seconds, first_only=False):
    """The async events of @ctx (their types, acknowledged) that arrive
    within @seconds; with @first_only, the first one only. One look at
    least: 0 seconds takes what is already queued."""
    _event_fds_nonblocking()
    events, deadline = [], time.monotonic() + seconds
    while not (first_only and events):
        try:
            ev = ctx.get_async_event()
        except Exception:  # none queued
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
            continue
        ev.ack()
        events.append(ev.event_type)
    return events


def async_event(ctx, timeout):
    """The next async event of @ctx, or None after @timeout seconds."""
    events = async_events(ctx, timeout, first_only=True)
    return events[0] if events else None


CGROUP_ROOT = "/sys/fs/cgroup"


@contextlib.contextmanager
def memory_cgroup(name, max_bytes=None):
    """A child cgroup of the cgroup2 root with the memory controller on (and
    memory.max if given); yields its path and removes it after."""
    if not os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.controllers")):
        subprocess.run(["mount", "-t", "cgroup2", "none", CGROUP_ROOT], check=True)
    with open(os.path.join(CGROUP_ROOT, "cgroup.subtree_control"), "w") as f:
        f.write("+memory")
    path = os.path.join(CGROUP_ROOT, name)
    os.makedirs(path, exist_ok=True)
    if max_bytes is not None:
        with open(os.path.join(path, "memory.max"), "w") as f:
            f.write(str(max_bytes))
    yield path
    for _ in range(100):  # a killed process may take a moment to go
        try:
            os.rmdir(path)
            break
        except OSError:
            time.sleep(0.1)


@pytest.fixture
def ctx():
    with Context(name=RDMA_DEV) as c:
        yield c


@pytest.fixture
def pd(ctx):
    with PD(ctx) as p:
        yield p


@pytest.fixture
def loopback(ctx, pd):
    return LoopbackQP(ctx, pd)


@contextlib.contextmanager
def memwatch_max_overlap(value):
    """vm.memwatch_max_overlap at @value while entered."""
    path = "/proc/sys/vm/memwatch_max_overlap"
    with open(path) as f:
        old = f.read().strip()
    with open(path, "w") as f:
        f.write(str(value))
    try:
        yield
    finally:
        with open(path, "w") as f:
            f.write(old)
