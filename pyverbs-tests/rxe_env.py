# SPDX-License-Identifier: GPL-2.0
"""What the pyverbs tests, the cluster suite (cluster-tests/) and the
examples suite share without pytest: anonymous memory through libc, byte
comparison, and the device's RoCE v2 GID."""
import ctypes
import os
import pathlib
import subprocess
import sys

# libodpwatch's Python bindings (libprovider/python/), for both test trees.
os.environ.setdefault("ODPWATCH_LIB", "/out/guest/lib/libodpwatch.so.0")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "libprovider" / "python"))

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PROT_RW = 0x3
MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE, MAP_HUGETLB = 0x02, 0x20, 0x100000, 0x40000
MAP_FAILED = ctypes.c_void_p(-1).value


def mmap_anon(length, addr=None, flags=0):
    """Map anonymous memory (exactly at addr if given); returns its address."""
    fl = MAP_PRIVATE | MAP_ANONYMOUS | flags | (MAP_FIXED_NOREPLACE if addr else 0)
    p = libc.mmap(addr, length, PROT_RW, fl, -1, 0)
    if p in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    if addr and p != addr:
        libc.munmap(p, length)
        raise OSError("mmap did not land at the requested address")
    return p


def assert_bytes(got, want, what="bytes"):
    """got == want, failing with where they first differ. Not a plain
    assert: pytest's explanation of two unequal long byte strings (a diff)
    takes minutes per KiB."""
    if got == want:
        return
    n = min(len(got), len(want))
    at = next((i for i in range(n) if got[i] != want[i]), n)
    raise AssertionError(f"{what}: {len(got)} bytes, {len(want)} wanted; first difference at "
                         f"offset {at}: {got[at:at + 8].hex()} != {want[at:at + 8].hex()}")


MADV_DONTNEED, MADV_NOHUGEPAGE = 4, 15


def madvise(addr, length, advice):
    if libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), advice):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def madvise_dontneed(addr, length):
    madvise(addr, length, MADV_DONTNEED)


def munmap(addr, length):
    if libc.munmap(addr, length):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def roce_v2_ipv4_gid(dev, port=1):
    """The first RoCE v2 GID with an IPv4-mapped address, from sysfs: its
    index and its value."""
    base = f"/sys/class/infiniband/{dev}/ports/{port}"
    for name in sorted(os.listdir(f"{base}/gids"), key=int):
        try:
            with open(f"{base}/gid_attrs/types/{name}") as f:
                gid_type = f.read().strip()
            with open(f"{base}/gids/{name}") as f:
                gid = f.read().strip()
        except OSError:
            continue
        if gid_type == "RoCE v2" and gid.startswith("0000:0000:0000:0000:0000:ffff:"):
            return int(name), gid
    raise RuntimeError(f"{dev}: no RoCE v2 IPv4 GID (does the netdev have an address?)")


def mr_counters(lkey, dev=None):
    """The ODP counters of the MR with @lkey, from `odpwatch mr-counters`
    (strings, by column name), or None if the device lists no such MR."""
    dev = dev or os.environ.get("RDMA_DEV", "rxe0")
    r = subprocess.run(["/out/guest/bin/odpwatch", "-d", dev, "mr-counters"],
                       capture_output=True, text=True, timeout=60, check=True)
    lines = r.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mrn"])
    cols = lines[head].split()
    for line in lines[head + 1:]:
        row = dict(zip(cols, line.split()))
        if row and int(row["lkey"], 16) == lkey:
            return row
    return None
