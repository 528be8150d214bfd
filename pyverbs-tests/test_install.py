# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""libodpwatch as a distribution builds and installs it: without the odpwatch
kernel's headers and without the tests (scripts/build-guest.sh, installed
with DESTDIR=/out/guest/distro, prefix /usr). What an MPI library's build
finds there, and what the library does on a kernel it was not built for:
memwatch says EOPNOTSUPP, the ODP policies work."""
import glob
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path("/out/guest/distro")
PYTHON = pathlib.Path(__file__).resolve().parent.parent / "libprovider" / "python"
TESTS = {"regcache-test", "regcache-test-asan", "regcache-test-tsan", "c-abi-check", "failnth-sweep",
         "odpwatch-teardown", "odpwatch-stress", "odpwatch-limits", "odpwatch-seccomp-deny",
         "ofi-mr-cache-test", "ucx-preload-test", "libodpwatch-ofi-blind.so"}


def libdir():
    found = glob.glob(str(ROOT / "usr/lib*/**/libodpwatch.so.0"), recursive=True)
    assert len(found) == 1, found
    return pathlib.Path(found[0]).parent


def test_the_install_has_the_library_its_headers_pkgconfig_and_man_pages_and_no_test():
    assert os.listdir(ROOT / "usr/bin") == ["odpwatch"]
    lib = libdir()
    assert (lib / "pkgconfig/odpwatch.pc").is_file()
    if (lib / "libodpwatch-ofi.so.0").exists():
        assert (lib / "pkgconfig/odpwatch-ofi.pc").is_file()
    for h in ("odpwatch.h", "regcache.h", "memwatch.h"):
        assert (ROOT / "usr/include/odpwatch" / h).is_file(), h
    for page in ("man2/memwatch_create.2", "man3/odpwatch_cache_create.3", "man3/odpwatch_memwatch_create.3"):
        assert (ROOT / "usr/share/man" / page).is_file(), page
    installed = {p.name for p in ROOT.rglob("*")}
    assert not installed & TESTS, sorted(installed & TESTS)


def test_the_cache_benchmark_finds_its_peers_in_libexec():
    """odpwatch-cache-peers is a program odpwatch runs, so it lives in
    libexec/odpwatch, where the installed odpwatch must find it."""
    peers = ROOT / "usr/libexec/odpwatch/odpwatch-cache-peers"
    assert peers.is_file(), "built where UCX and libfabric are, as in this root filesystem"
    r = subprocess.run([str(ROOT / "usr/bin/odpwatch"), "bench", "cache", "--only",
                        "peers: libfabric MR cache, disabled", "--quick", "--reps", "1"],
                       env=dict(os.environ, LD_LIBRARY_PATH=str(libdir())),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not installed" not in r.stdout + r.stderr, r.stdout
    assert "did not finish" not in r.stdout + r.stderr, r.stdout + r.stderr
    # A row the peer measured, not the report's title.
    assert "| libfabric MR cache (disabled) |" in r.stdout, r.stdout


def test_a_c_program_builds_with_pkg_config_against_the_install(tmp_path):
    """What an MPI library's configure does: pkg-config for the flags, the
    public headers in C, linked and run."""
    lib = libdir()
    env = dict(os.environ, PKG_CONFIG_SYSROOT_DIR=str(ROOT), PKG_CONFIG_PATH=str(lib / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "odpwatch"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    src = pathlib.Path(__file__).resolve().parent.parent / "libprovider/tests/c_abi_check.c"
    exe = tmp_path / "c-abi-check"
    r = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-o", str(exe), str(src)] + flags,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], env=dict(os.environ, LD_LIBRARY_PATH=str(lib)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("odpwatch "), r.stdout + r.stderr


CHECK = """
import ctypes, errno, mmap
import pyverbs.enums as e
from pyverbs.device import Context
from pyverbs.pd import PD
from odpwatch_memwatch import MemWatch
from odpwatch_cache import RegCache
try:
    MemWatch()
    raise SystemExit("memwatch created by a library built without its system call")
except OSError as x:
    assert x.errno == errno.EOPNOTSUPP, x
buf = mmap.mmap(-1, 65536)
buf.write(b"x" * 65536)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
with Context(name="{dev}") as ctx, PD(ctx) as pd:
    with RegCache(ctx, pd, policy="pinned") as c:
        try:
            c.get(addr, 65536, e.IBV_ACCESS_LOCAL_WRITE)
            raise SystemExit("a pinned get without memwatch succeeded")
        except OSError as x:
            assert x.errno == errno.EOPNOTSUPP, x
    with RegCache(ctx, pd) as c:
        with c.get(addr, 65536, e.IBV_ACCESS_LOCAL_WRITE) as reg:
            assert reg.lkey and reg.length >= 65536
        print("auto:", c.policy)
"""


def test_built_without_the_headers_memwatch_is_eopnotsupp_and_odp_works():
    """On this kernel memwatch exists; the distribution's build has no
    system call number for it, so it must say EOPNOTSUPP, not guess one, and
    the auto policy must fall to ODP."""
    dev = os.environ.get("RDMA_DEV", "rxe0")
    env = dict(os.environ, ODPWATCH_LIB=str(libdir() / "libodpwatch.so.0"), PYTHONPATH=str(PYTHON))
    r = subprocess.run([sys.executable, "-c", CHECK.replace("{dev}", dev)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() in ("auto: implicit-odp", "auto: explicit-odp"), r.stdout
