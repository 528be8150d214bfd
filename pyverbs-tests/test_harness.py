# SPDX-License-Identifier: GPL-2.0
"""The guest the harness boots: our kernel, rxe with ODP, huge pages, and the
stale-registration problem that odpwatch exists to end, with real traffic."""
import ctypes
import platform

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR

from conftest import MAP_HUGETLB, mmap_anon, munmap

LEN = 64 * 1024


def test_kernel_is_odpwatch():
    assert "-odpwatch" in platform.release(), platform.release()


def test_rxe_advertises_odp(ctx):
    odp = ctx.query_device_ex().odp_caps
    assert odp.general_caps & e.IBV_ODP_SUPPORT
    rc = odp.rc_odp_caps
    for bit in (e.IBV_ODP_SUPPORT_SEND, e.IBV_ODP_SUPPORT_RECV, e.IBV_ODP_SUPPORT_WRITE,
                e.IBV_ODP_SUPPORT_READ, e.IBV_ODP_SUPPORT_ATOMIC):
        assert rc & bit, f"RC ODP cap {bit:#x} missing from {rc:#x}"


def test_huge_pages_reserved():
    with open("/proc/sys/vm/nr_hugepages") as f:
        assert int(f.read()) >= 16
    addr = mmap_anon(2 << 20, flags=MAP_HUGETLB)
    ctypes.memset(addr, 1, 2 << 20)
    munmap(addr, 2 << 20)


def test_hugetlbfs_mounted():
    """Huge-page MRs over hugetlbfs files need the mount at /dev/hugepages."""
    import mmap
    import os
    with open("/proc/mounts") as f:
        assert any(l.split()[1:3] == ["/dev/hugepages", "hugetlbfs"] for l in f)
    path = "/dev/hugepages/odpwatch-test"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 2 << 20)
        m = mmap.mmap(fd, 2 << 20)
        m[:4] = b"huge"
        assert m[:4] == b"huge"
        m.close()
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.mark.parametrize("policy,access,expected", [
    # A pinned MR keeps the freed buffer's pages and sends them: the bug a
    # registration cache hits when it cannot see munmap.
    ("pinned", 0, b"A"),
    # An ODP MR follows the new mapping.
    ("odp", e.IBV_ACCESS_ON_DEMAND, b"B"),
])
def test_cached_registration_after_buffer_reuse(pd, loopback, policy, access, expected):
    a = mmap_anon(LEN)
    ctypes.memset(a, ord("A"), LEN)
    cached = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | access, address=a)
    munmap(a, LEN)                   # the application frees A...
    b = mmap_anon(LEN, addr=a)       # ...and B lands at the same address
    ctypes.memset(b, ord("B"), LEN)
    peer = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    peer.write(b"-" * LEN, LEN)
    try:
        status = loopback.rdma(e.IBV_WR_RDMA_WRITE, cached, a, LEN, peer, peer.buf)
        assert status == e.IBV_WC_SUCCESS
        got = peer.read(LEN, 0)
        assert got == expected * LEN, f"{policy}: peer received {got[:8]!r}..."
    finally:
        cached.close()
        munmap(b, LEN)


def test_odp_mr_rdma_read_sees_new_data_after_madvise(pd, loopback):
    """MADV_DONTNEED zaps the pages under an ODP MR; the next access faults fresh zeroes."""
    MADV_DONTNEED = 4
    buf = mmap_anon(LEN)
    ctypes.memset(buf, 0x5A, LEN)
    odp = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ |
             e.IBV_ACCESS_ON_DEMAND, address=buf)
    local = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE)
    try:
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN, odp, buf) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == b"\x5a" * LEN
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.madvise(ctypes.c_void_p(buf), ctypes.c_size_t(LEN), MADV_DONTNEED) == 0
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN, odp, buf) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == b"\x00" * LEN
    finally:
        odp.close()
        local.close()
        munmap(buf, LEN)
