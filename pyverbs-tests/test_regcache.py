# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""The registration cache of libodpwatch, end to end on rxe: one pytest test
per case of regcache-test (libprovider/tests/regcache_test.cpp), which moves
real bytes through the cache's registrations with RDMA WRITE; then the same
through the Python binding (libprovider/python/odpwatch_cache.py) beside
pyverbs."""
import ctypes
import errno
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR

from conftest import LoopbackQP, assert_bytes, memwatch_max_overlap, mmap_anon, munmap

BINARY = "/out/guest/bin/regcache-test"
CASES = ["reuse-pinned", "reuse-explicit-odp", "reuse-implicit-odp",
         "ways-to-free-pinned", "ways-to-free-explicit-odp", "ways-to-free-implicit-odp",
         "threads-pinned", "threads-explicit-odp", "threads-implicit-odp",
         "limits", "implicit-max-bytes", "events", "bad-input", "no-memwatch", "memwatch-refused",
         "overlap-pinned", "overlap-explicit-odp", "memlock-retry", "memlock-union-keeps-others",
         "page-index",
         "union-loses-a-changed-neighbour", "hits-release-freed-memory", "fork-child",
         "default-limits", "eviction-order", "churn", "more-ways-to-free-pinned",
         "more-ways-to-free-explicit-odp", "more-ways-to-free-implicit-odp", "huge-pages-pinned",
         "huge-pages-explicit-odp", "failed-registration", "brk-pinned", "brk-explicit-odp",
         "new-cache-at-the-same-address", "get-at-thread-exit", "odp-needs", "double-put"]


@pytest.mark.parametrize("case", CASES)
def test_regcache(case):
    r = subprocess.run([BINARY, case], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and f"ok 1 {case}" in r.stdout, r.stdout + r.stderr


# The cases where threads, references and lifetimes meet, again in the
# builds with ThreadSanitizer and with AddressSanitizer+UBSan (the library's
# sources built in): any report fails.
SANITIZED = ["double-put", "threads-pinned", "threads-explicit-odp", "threads-implicit-odp", "churn",
             "overlap-pinned", "overlap-explicit-odp", "limits", "eviction-order", "events",
             "reuse-pinned", "ways-to-free-pinned", "memlock-retry", "fork-child", "bad-input",
             "new-cache-at-the-same-address", "get-at-thread-exit"]
SANITIZER_ENV = {
    "tsan": {"TSAN_OPTIONS": "halt_on_error=1:exitcode=66:second_deadlock_stack=1"},
    "asan": {"ASAN_OPTIONS": "detect_leaks=1:halt_on_error=1:exitcode=66",
             "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"},
}
SANITIZER_REPORT = re.compile(r"WARNING: ThreadSanitizer|ERROR: (Address|Leak)Sanitizer|"
                              r"runtime error:")


def run_sanitized(san, args):
    return subprocess.run([f"{BINARY}-{san}", *args], capture_output=True, text=True,
                          timeout=900, env={**os.environ, **SANITIZER_ENV[san]})


@pytest.mark.parametrize("san", ["tsan", "asan"])
def test_regcache_sanitized(san):
    r = run_sanitized(san, SANITIZED)
    out = r.stdout + r.stderr
    report = SANITIZER_REPORT.search(out)
    assert not report, out[max(0, report.start() - 200):report.start() + 3000]
    assert r.returncode == 0 and out.count("\nok ") == len(SANITIZED), out


@pytest.mark.parametrize("san,want", [("tsan", "WARNING: ThreadSanitizer: data race"),
                                      ("asan", "ERROR: AddressSanitizer: heap-use-after-free")])
def test_sanitizer_builds_report(san, want):
    """The canary's race and use after free are reported: the sanitizer is
    really in the build the test above calls clean."""
    r = run_sanitized(san, ["--canary"])
    assert r.returncode == 66 and want in r.stderr, r.stdout + r.stderr


def test_every_case_runs_here():
    r = subprocess.run([BINARY, "--list"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and sorted(r.stdout.split()) == sorted(CASES)
    r = subprocess.run([BINARY, "no-such-case"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not ok 1 no-such-case # no such case" in r.stdout


# The Python binding, beside pyverbs: the cache's registrations serve a
# pyverbs QP of the same (imported) PD.
os.environ.setdefault("ODPWATCH_LIB", "/out/guest/lib/libodpwatch.so.0")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "libprovider" / "python"))
import odpwatch_cache  # noqa: E402

LEN = 64 << 10
SLOT = 0x3f0000000000  # fixed, so the next buffer lands at the freed one's address


def fill(addr, byte):
    ctypes.memset(addr, byte, LEN)


@pytest.mark.parametrize("policy", ["pinned", "explicit-odp", "implicit-odp"])
def test_python_cache_never_sends_freed_bytes(ctx, pd, loopback, policy):
    dst = mmap_anon(LEN)
    dst_mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE, address=dst)
    try:
        with odpwatch_cache.RegCache(ctx, pd, policy=policy) as cache:
            assert cache.policy == {"pinned": "pinned+memwatch"}.get(policy, policy)
            for byte in b"AB":
                buf = mmap_anon(LEN, addr=SLOT)
                fill(buf, byte)
                with cache.get(buf, LEN, e.IBV_ACCESS_LOCAL_WRITE) as reg:
                    st = loopback.rdma(e.IBV_WR_RDMA_WRITE, reg, buf, LEN, dst_mr, dst)
                assert st == e.IBV_WC_SUCCESS
                assert_bytes(ctypes.string_at(dst, LEN), bytes([byte]) * LEN)
                munmap(buf, LEN)
            s = cache.stats()
            stale = 1 if policy == "pinned" else 0
            assert (s["invalidations"], s["in_use"]) == (stale, 0), s
    finally:
        dst_mr.close()
        munmap(dst, LEN)


def test_python_cache_auto_and_errors(ctx, pd):
    with pytest.raises(ValueError):
        odpwatch_cache.RegCache(ctx, pd, policy="nonsense")
    buf = mmap_anon(LEN)
    try:
        with odpwatch_cache.RegCache(ctx, pd) as cache:
            # rxe offers implicit ODP: the automatic policy takes it.
            assert cache.policy == "implicit-odp"
            reg = cache.get(buf, LEN, e.IBV_ACCESS_LOCAL_WRITE)
            reg_handle = reg._handle
            reg.put()
            with pytest.raises(OSError) as err:
                odpwatch_cache._check(odpwatch_cache._lib.odpwatch_cache_put(
                    cache._cache, reg_handle), "second put")
            assert err.value.errno == errno.EINVAL
            with pytest.raises(OSError) as err:
                cache.get(buf, 0, e.IBV_ACCESS_LOCAL_WRITE)
            assert err.value.errno == errno.EINVAL
    finally:
        munmap(buf, LEN)


REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE


def test_default_cache_exposes_only_the_buffer(ctx, pd):
    """With default attributes the cache picks implicit ODP on rxe, whose
    rkey reaches every byte of the process. A registration asked for with
    remote access must expose its own range only: a peer's RDMA READ through
    its rkey outside the buffer (here, of another buffer of the process)
    fails with a remote access error."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    buf, secret, land = mmap_anon(LEN), mmap_anon(LEN), mmap_anon(LEN)
    land_mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE, address=land)
    try:
        fill(buf, 0x42)
        fill(secret, 0x53)
        with odpwatch_cache.RegCache(ctx, pd) as cache:
            assert cache.policy == "implicit-odp"
            with cache.get(buf, LEN, REMOTE) as reg:
                assert requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, buf) == \
                    e.IBV_WC_SUCCESS
                assert_bytes(ctypes.string_at(land, 64), b"\x42" * 64)
                fill(land, 0)
                st = requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, secret)
                assert ctypes.string_at(land, 64) != b"\x53" * 64, "the peer read the secret"
                assert st == e.IBV_WC_REM_ACCESS_ERR, f"status {st}"
            # Local-only access still shares the one implicit MR.
            with cache.get(buf, LEN, e.IBV_ACCESS_LOCAL_WRITE) as a, \
                    cache.get(secret, LEN, e.IBV_ACCESS_LOCAL_WRITE) as b:
                assert a.lkey == b.lkey
    finally:
        land_mr.close()
        for p in (buf, secret, land):
            munmap(p, LEN)


K = 1 << 10


@pytest.mark.parametrize("policy", ["auto", "pinned"])
@pytest.mark.parametrize("how", ["unmapped-and-reused", "containing", "merge"])
def test_remote_rkey_reaches_only_the_pages_asked_for(ctx, pd, policy, how):
    """A get with remote access hands its rkey to a peer, which must reach the
    pages asked for and no others (userspace audit H1). A 64 KiB buffer at X
    was registered with remote read and put back; then a 4 KiB message at X
    (or 32 KiB across X-16K, for the merge) is registered with remote read,
    and a secret sits at X+32K: after the buffer's addresses were unmapped
    and mapped again, or in the old buffer's own tail as an allocator reuses
    freed memory, or beside a range that overlaps the cached one. The
    peer's READ of the message succeeds; its READ of the secret through the
    same rkey fails with a remote access error. With default attributes on
    rxe the remote get is an explicit ODP MR, which follows the address."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    region = mmap_anon(128 * K)
    x, secret = region + 32 * K, region + 64 * K
    land = mmap_anon(LEN)
    land_mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE, address=land)
    try:
        with odpwatch_cache.RegCache(ctx, pd, policy=policy) as cache:
            with cache.get(x, 64 * K, REMOTE):
                pass
            if how == "unmapped-and-reused":
                munmap(x, 64 * K)
                mmap_anon(4 * K, addr=x)
                mmap_anon(32 * K, addr=secret)
            ctypes.memset(region, 0x4d, 36 * K)  # up to the end of the message
            ctypes.memset(secret, 0x53, 32 * K)
            msg, msg_len = (x - 16 * K, 32 * K) if how == "merge" else (x, 4 * K)
            with cache.get(msg, msg_len, REMOTE) as reg:
                assert requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, msg) == \
                    e.IBV_WC_SUCCESS, "the peer's read of the message"
                assert_bytes(ctypes.string_at(land, 64), b"\x4d" * 64)
                ctypes.memset(land, 0, 64)
                st = requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, secret)
                assert ctypes.string_at(land, 64) != b"\x53" * 64, "the peer read the secret"
                assert st == e.IBV_WC_REM_ACCESS_ERR, f"status {st}"
            # The same pages with the same access again: still a hit.
            hits = cache.stats()["hits"]
            requester, _responder = LoopbackQP.pair(ctx, pd)  # the old pair is in error
            with cache.get(msg, msg_len, REMOTE) as reg:
                assert requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, msg) == \
                    e.IBV_WC_SUCCESS
            assert cache.stats()["hits"] == hits + 1
    finally:
        land_mr.close()
        munmap(land, LEN)
        munmap(region, 128 * K)


@pytest.mark.parametrize("policy", ["auto", "pinned"])
def test_an_old_rkey_stops_at_the_unmap(ctx, pd, policy):
    """The memwatch half of audit H1: a peer that kept the rkey of a
    registration put back (as UCX caches rkeys) must not reach what is
    mapped at its addresses after the buffer was unmapped, once the cache
    read memwatch's events: the registration is dropped and deregistered.
    With default attributes on rxe it is an explicit ODP MR, which would
    follow the address to the new mapping (the secret); a pinned one keeps
    the old pages, which the cache must give back as well."""
    requester, _responder = LoopbackQP.pair(ctx, pd)
    x = mmap_anon(64 * K)
    land = mmap_anon(LEN)
    land_mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE, address=land)
    try:
        with odpwatch_cache.RegCache(ctx, pd, policy=policy) as cache:
            ctypes.memset(x, 0x4d, 64 * K)
            with cache.get(x, 64 * K, REMOTE) as reg:
                assert requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, x) == \
                    e.IBV_WC_SUCCESS
            munmap(x, 64 * K)
            mmap_anon(64 * K, addr=x)
            ctypes.memset(x, 0x53, 64 * K)
            dereg0 = cache.stats()["deregistrations"]
            cache.process_events()
            for _ in range(100):  # the reaper deregisters off this thread
                if cache.stats()["deregistrations"] > dereg0:
                    break
                time.sleep(0.05)
            s = cache.stats()
            assert (s["entries"], s["deregistrations"]) == (0, dereg0 + 1), s
            ctypes.memset(land, 0, 64)
            st = requester.rdma(e.IBV_WR_RDMA_READ, land_mr, land, 64, reg, x)
            assert ctypes.string_at(land, 64) != b"\x53" * 64, "the peer read the secret"
            assert st == e.IBV_WC_REM_ACCESS_ERR, f"status {st}"
    finally:
        land_mr.close()
        munmap(land, LEN)
        munmap(x, 64 * K)


LIBRARY = "/out/guest/lib/libodpwatch.so.0"


def test_library_exports_only_its_versioned_c_abi():
    """nm -D: every symbol libodpwatch defines for others is an odpwatch_*
    function of version node ODPWATCH_0.1 (and the node itself); none of the
    C++ inside (odpwatch::verbs, odpwatch::Memwatch, templates) leaks."""
    r = subprocess.run(["nm", "-D", "--defined-only", "--with-symbol-versions", LIBRARY],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    syms = [line.split()[-1] for line in r.stdout.splitlines() if line.strip()]
    stray = [s for s in syms
             if not re.fullmatch(r"odpwatch_\w+@@ODPWATCH_0\.1|ODPWATCH_0\.1", s)]
    assert not stray, f"{len(stray)} symbols beyond the C ABI, e.g. {stray[:5]}"
    for name in ("odpwatch_cache_create", "odpwatch_cache_get", "odpwatch_cache_put",
                 "odpwatch_query_odp_caps", "odpwatch_version"):
        assert f"{name}@@ODPWATCH_0.1" in syms, r.stdout


def test_version_is_the_builds():
    """odpwatch_version() says the project's version from CMake."""
    cmake = pathlib.Path("/odpwatch/CMakeLists.txt").read_text()
    want = re.search(r"project\(odpwatch VERSION ([\d.]+)", cmake)[1]
    lib = ctypes.CDLL(LIBRARY)
    lib.odpwatch_version.restype = ctypes.c_char_p
    assert lib.odpwatch_version().decode() == want


def test_pinned_cache_past_the_overlap_bound_registers_once(ctx, pd):
    """Three remote-access registrations of one page (keys of their own,
    never merged) under vm.memwatch_max_overlap 2: the third cannot be
    watched (EMLINK). The pinned cache must still register it, for one use:
    it is never an entry, and the next get of it is a miss again. At
    ade1d2a the get failed with EMLINK."""
    accesses = [e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ,
                e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE, REMOTE]
    buf = mmap_anon(LEN)
    try:
        with memwatch_max_overlap(2), \
                odpwatch_cache.RegCache(ctx, pd, policy="pinned") as cache:
            regs = [cache.get(buf, 4096, a) for a in accesses]
            for r in regs:
                r.put()
            s = cache.stats()
            assert (s["misses"], s["in_use"], s["entries"]) == (3, 0, 2), s
            cache.get(buf, 4096, accesses[2]).put()
            cache.get(buf, 4096, accesses[0]).put()
            s = cache.stats()
            assert (s["misses"], s["hits"], s["entries"]) == (4, 1, 2), s
    finally:
        munmap(buf, LEN)


def test_unwatchable_union_keeps_the_entries_it_spans(ctx, pd):
    """Local access is merged: a get over two cached pages registers their
    union, whose watch overlaps both of theirs. Under a bound of 2 that
    watch is refused (EMLINK), and so is one of the range asked for: the
    get is served once, unwatched, and the two cached entries stay (a hit
    after). At c58f7f1 the unwatched union replaced them: a miss."""
    lw = e.IBV_ACCESS_LOCAL_WRITE
    buf = mmap_anon(LEN)
    try:
        with memwatch_max_overlap(2), \
                odpwatch_cache.RegCache(ctx, pd, policy="pinned") as cache:
            cache.get(buf, 4096, lw).put()
            cache.get(buf + 4096, 4096, lw).put()
            cache.get(buf, 8192, lw).put()
            s = cache.stats()
            assert (s["misses"], s["entries"]) == (3, 2), s
            cache.get(buf, 4096, lw).put()
            cache.get(buf + 4096, 4096, lw).put()
            s = cache.stats()
            assert (s["misses"], s["hits"], s["entries"]) == (3, 2, 2), s
    finally:
        munmap(buf, LEN)
