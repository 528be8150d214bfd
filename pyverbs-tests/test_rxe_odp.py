# SPDX-License-Identifier: GPL-2.0
"""rxe On-Demand Paging as an application sees it: implicit MRs, huge pages,
data that follows the mapping through madvise, munmap/mmap and fork, and
traffic racing invalidations. Every check reads the bytes that moved."""
import ctypes
import os
import threading

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR

from conftest import (MADV_NOHUGEPAGE, MAP_HUGETLB, PROT_RW, LoopbackQP, hw_counter, libc,
                      madvise, madvise_dontneed, mmap_anon, munmap)

LEN = 64 * 1024
HUGE = 2 << 20
ODP = (e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
       e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)


def pattern(length, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(length))


def poke(addr, data):
    ctypes.memmove(addr, data, len(data))


def peek(addr, length):
    return ctypes.string_at(addr, length)


@pytest.fixture
def local(pd):
    """A pinned buffer on the requester's side of every transfer."""
    mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE)
    yield mr
    mr.close()


@pytest.fixture
def implicit(pd):
    mr = MR(pd, 0, ODP, implicit=True)
    yield mr
    mr.close()


@pytest.fixture(params=["explicit", "implicit"])
def odp_buffer(request, pd):
    """A 64 KiB buffer and an ODP MR that reaches it: its own, or an implicit one."""
    buf = mmap_anon(LEN)
    if request.param == "implicit":
        mr = MR(pd, 0, ODP, implicit=True)
    else:
        mr = MR(pd, LEN, ODP, address=buf)
    yield mr, buf
    mr.close()
    munmap(buf, LEN)


def test_implicit_advertised(ctx):
    assert ctx.query_device_ex().odp_caps.general_caps & e.IBV_ODP_SUPPORT_IMPLICIT


def test_implicit_send_recv(loopback, implicit):
    """The implicit MR's lkey serves both the send and the receive buffer."""
    src, dst = mmap_anon(LEN), mmap_anon(LEN)
    try:
        poke(src, pattern(LEN, 1))
        assert loopback.send_recv(implicit, src, implicit, dst, LEN) == \
            (e.IBV_WC_SUCCESS, e.IBV_WC_SUCCESS)
        assert peek(dst, LEN) == pattern(LEN, 1)
    finally:
        munmap(src, LEN)
        munmap(dst, LEN)


def test_implicit_remote_write_read_atomic(loopback, implicit, local):
    buf = mmap_anon(LEN)
    try:
        local.write(pattern(LEN, 2), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                             implicit, buf) == e.IBV_WC_SUCCESS
        assert peek(buf, LEN) == pattern(LEN, 2)
        poke(buf, pattern(LEN, 3))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             implicit, buf) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == pattern(LEN, 3)
        poke(buf + 8, (1000).to_bytes(8, "little"))
        assert loopback.fetch_add(local, local.buf, implicit, buf + 8, 24) == e.IBV_WC_SUCCESS
        assert int.from_bytes(local.read(8, 0), "little") == 1000
        assert int.from_bytes(peek(buf + 8, 8), "little") == 1024
    finally:
        munmap(buf, LEN)


def test_hugetlb_odp_mr(pd, loopback, local):
    """IBV_ACCESS_HUGETLB over 2 MiB pages; transfers cross 4 KiB boundaries."""
    buf = mmap_anon(HUGE, flags=MAP_HUGETLB)
    mr = MR(pd, HUGE, ODP | e.IBV_ACCESS_HUGETLB, address=buf)
    try:
        off = (1 << 20) - 100
        local.write(pattern(LEN, 4), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                             mr, buf + off) == e.IBV_WC_SUCCESS
        assert peek(buf + off, LEN) == pattern(LEN, 4)
        poke(buf + HUGE - LEN, pattern(LEN, 5))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf + HUGE - LEN) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == pattern(LEN, 5)
    finally:
        mr.close()
        munmap(buf, HUGE)


def test_hugetlb_flag_over_small_pages(pd, loopback, local):
    """IBV_ACCESS_HUGETLB over 4 KiB pages (THP kept off) works like any ODP MR:
    rxe's page list is per 4 KiB page whatever backs it."""
    buf = mmap_anon(HUGE)
    madvise(buf, HUGE, MADV_NOHUGEPAGE)
    mr = MR(pd, HUGE, ODP | e.IBV_ACCESS_HUGETLB, address=buf)
    try:
        local.write(pattern(LEN, 6), LEN)
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                             mr, buf + 12345) == e.IBV_WC_SUCCESS
        assert peek(buf + 12345, LEN) == pattern(LEN, 6)
    finally:
        mr.close()
        munmap(buf, HUGE)


def test_data_follows_madvise_and_remap(loopback, local, odp_buffer):
    """Each cycle changes the pages behind the buffer; RDMA READ sees the current ones."""
    mr, buf = odp_buffer
    for cycle in range(6):
        if cycle % 2:
            madvise_dontneed(buf, LEN)              # zero-filled on next touch
        else:
            munmap(buf, LEN)
            assert mmap_anon(LEN, addr=buf) == buf
        poke(buf, pattern(LEN, 10 + cycle))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == pattern(LEN, 10 + cycle), f"cycle {cycle}"


def test_fork_cow_with_odp_mr(pd, loopback, local):
    """After fork, the parent's writes break COW onto new pages; ODP follows them."""
    buf = mmap_anon(LEN)
    mr = MR(pd, LEN, ODP, address=buf)
    try:
        poke(buf, pattern(LEN, 20))
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                                # the child scribbles on its copy
            poke(buf, pattern(LEN, 21))
            os.write(w, b"x")
            os._exit(0)
        os.read(r, 1)
        os.waitpid(pid, 0)
        os.close(r)
        os.close(w)
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == pattern(LEN, 20), "saw the child's copy"
        poke(buf, pattern(LEN, 22))                 # COW break in the parent
        assert loopback.rdma(e.IBV_WR_RDMA_READ, local, local.buf, LEN,
                             mr, buf) == e.IBV_WC_SUCCESS
        assert local.read(LEN, 0) == pattern(LEN, 22)
    finally:
        mr.close()
        munmap(buf, LEN)


def test_traffic_races_invalidation(loopback, local, odp_buffer):
    """A thread zaps the pages while RDMA WRITEs land: no error, last write wins."""
    mr, buf = odp_buffer
    stop = threading.Event()
    zaps = 0

    def zapper():
        nonlocal zaps
        while not stop.is_set():
            madvise_dontneed(buf, LEN)
            zaps += 1

    t = threading.Thread(target=zapper)
    t.start()
    try:
        for i in range(150):
            local.write(pattern(LEN, i), LEN)
            assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                                 mr, buf) == e.IBV_WC_SUCCESS, f"write {i}"
    finally:
        stop.set()
        t.join()
    assert zaps > 10, f"only {zaps} invalidations raced the writes"
    local.write(pattern(LEN, 200), LEN)
    assert loopback.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, LEN,
                         mr, buf) == e.IBV_WC_SUCCESS
    assert peek(buf, LEN) == pattern(LEN, 200)


def test_first_touch_write_faults_off_the_qp(pd, loopback):
    """A 16 MiB RDMA WRITE into untouched ODP memory: the responder answers
    absent pages with RNR NAKs while the faults run elsewhere, and the 4 MiB
    fault-around keeps them few (one per page would be 4096)."""
    size = 16 << 20
    src_buf, dst_buf = mmap_anon(size), mmap_anon(size)
    src = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE, address=src_buf)   # pinned
    dst = MR(pd, size, ODP, address=dst_buf)
    try:
        ctypes.memset(src_buf, 0x6B, size)
        rnr0, handled0 = hw_counter("rcvd_rnr_err"), hw_counter("odp_page_faults_handled")
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, src, src_buf, size,
                             dst, dst_buf, timeout=600) == e.IBV_WC_SUCCESS
        rnr = hw_counter("rcvd_rnr_err") - rnr0
        handled = hw_counter("odp_page_faults_handled") - handled0
        assert peek(dst_buf, 4096) == b"\x6b" * 4096
        assert peek(dst_buf + size - 4096, 4096) == b"\x6b" * 4096
        assert handled >= size // 4096, f"{handled} pages faulted in"
        assert 1 <= rnr <= 64, f"{rnr} RNR NAKs for {size >> 20} MiB"
    finally:
        dst.close()
        src.close()
        munmap(src_buf, size)
        munmap(dst_buf, size)


MAP_SHARED = 0x01
MAX_TRANSIENT = 16  # RXE_ODP_MAX_TRANSIENT: failed faults at one address answered RNR


def test_fault_past_a_files_end_is_a_remote_access_error(ctx, pd, local):
    """A page that is mapped but can never be faulted in (a shared file
    mapping past the file's end): the responder cannot tell that from a
    fault that ran out of memory, answers RNR, but at most MAX_TRANSIENT
    times in a row, then reports the remote access error that an unmapped
    address gets at once. Without the bound the WRITE would never end."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    fd = os.memfd_create("odp-past-eof")
    buf = None
    try:
        os.ftruncate(fd, 4096)
        buf = libc.mmap(None, LEN, PROT_RW, MAP_SHARED, fd, 0)
        assert buf not in (None, ctypes.c_void_p(-1).value)
        mr = MR(pd, LEN, ODP, address=buf)
        try:
            rnr0 = hw_counter("rcvd_rnr_err")
            status = requester.rdma(e.IBV_WR_RDMA_WRITE, local, local.buf, 4096,
                                    mr, buf + 8192, timeout=120)
            rnr = hw_counter("rcvd_rnr_err") - rnr0
            print(f"status {status} after {rnr} RNR NAKs")
            assert status == e.IBV_WC_REM_ACCESS_ERR
            assert MAX_TRANSIENT <= rnr <= MAX_TRANSIENT + 4, f"{rnr} RNR NAKs"
        finally:
            mr.close()
    finally:
        if buf:
            munmap(buf, LEN)
        os.close(fd)
