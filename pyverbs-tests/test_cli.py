# SPDX-License-Identifier: (GPL-2.0 OR BSD-2-Clause)
"""The odpwatch command-line tool against the kernel: per-MR ODP counters
over RDMA netlink, cross-checked with iproute2's `rdma stat show mr`, and
every process's memwatch descriptors from /proc/PID/fdinfo."""
import ctypes
import json
import os
import subprocess

import pytest
import pyverbs.enums as e
from pyverbs.mr import MR

from conftest import RDMA_DEV, mmap_anon, munmap

ODPWATCH = "/out/guest/bin/odpwatch"
LEN = 1 << 20


def rows(out):
    """mr-counters' table as dicts, keyed by the header's column names."""
    lines = out.splitlines()
    head = next(i for i, l in enumerate(lines) if l.split()[:1] == ["mrn"])
    cols = lines[head].split()
    return [dict(zip(cols, l.split())) for l in lines[head + 1:] if l.strip()]


def test_mr_counters_after_a_first_touch_write(pd, loopback):
    src, dst = mmap_anon(LEN), mmap_anon(LEN)
    ctypes.memset(src, 0x5A, LEN)
    src_mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE, address=src)
    dst_mr = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                e.IBV_ACCESS_ON_DEMAND, address=dst)
    try:
        assert loopback.rdma(e.IBV_WR_RDMA_WRITE, src_mr, src, LEN, dst_mr, dst) == \
            e.IBV_WC_SUCCESS
        r = subprocess.run([ODPWATCH, "-d", RDMA_DEV, "mr-counters"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        mine = [x for x in rows(r.stdout) if int(x["lkey"], 16) == dst_mr.lkey]
        assert len(mine) == 1, r.stdout
        row = mine[0]
        assert int(row["length"]) == LEN
        # Every page of the 1 MiB was absent and faulted in by the responder
        # (page_faults counts pages, page_faults_handled faults, as mlx5).
        assert int(row["page_faults"]) >= LEN // 4096, row
        assert 1 <= int(row["page_faults_handled"]) <= LEN // 4096, row
        # The pinned source MR has no ODP counters, so it is not listed.
        assert not [x for x in rows(r.stdout) if int(x["lkey"], 16) == src_mr.lkey]

        # iproute2 reads the same netlink attributes.
        j = subprocess.run(["rdma", "-j", "stat", "show", "mr"], capture_output=True,
                           text=True, timeout=60)
        assert j.returncode == 0, j.stderr
        theirs = [x for x in json.loads(j.stdout) if str(x.get("mrn")) == row["mrn"]]
        assert len(theirs) == 1, j.stdout
        assert int(theirs[0]["page_faults"]) == int(row["page_faults"])
    finally:
        src_mr.close()
        dst_mr.close()
        munmap(src, LEN)
        munmap(dst, LEN)


def test_mr_counters_unknown_device():
    r = subprocess.run([ODPWATCH, "-d", "nosuchdev0", "mr-counters"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert "nosuchdev0" in r.stderr and "Traceback" not in r.stderr


def test_memwatch_stats_lists_this_process():
    from odpwatch_memwatch import MemWatch
    a, b = mmap_anon(2 * 4096), mmap_anon(4096)
    try:
        with MemWatch(nonblock=True) as mw:
            mw.add(a, 2 * 4096)
            mw.add(b, 4096)
            munmap(b, 4096)
            b = None
            r = subprocess.run([ODPWATCH, "memwatch-stats"], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stderr
            lines = r.stdout.splitlines()
            head = next(i for i, l in enumerate(lines) if l.split()[:1] == ["pid"])
            cols = lines[head].split()
            mine = [dict(zip(cols, l.split())) for l in lines[head + 1:]
                    if l.split()[:1] == [str(os.getpid())] and
                    l.split()[2] == str(mw.fd)]
            assert len(mine) == 1, r.stdout
            row = mine[0]
            assert (row["watches"], row["changes"], row["events-queued"]) == ("2", "1", "1"), row
            assert row["queue"].startswith("1/"), row
        # Closed: no longer listed.
        r = subprocess.run([ODPWATCH, "memwatch-stats"], capture_output=True, text=True,
                           timeout=60)
        assert not [l for l in r.stdout.splitlines() if l.split()[:1] == [str(os.getpid())]]
    finally:
        munmap(a, 2 * 4096)
        if b:
            munmap(b, 4096)


@pytest.mark.parametrize("args,rc,err", [
    ([], 2, "usage: odpwatch [-d DEVICE] COMMAND"),
    (["nosuch"], 2, "odpwatch: unknown command nosuch"),
    (["--nope"], 2, "odpwatch: unknown option --nope"),
    (["-d"], 2, "odpwatch: -d wants a device name"),
    (["-d", "nosuchdev0", "caps"], 1, "odpwatch caps: no RDMA device named nosuchdev0"),
    (["caps", "extra"], 2, "odpwatch caps: takes no arguments (got extra)"),
    (["demo", "--fast"], 2, "odpwatch demo: takes no arguments (got --fast)"),
    (["mr-counters", "x"], 2, "odpwatch mr-counters: takes no arguments (got x)"),
    (["memwatch-stats", "x"], 2, "odpwatch memwatch-stats: takes no arguments (got x)"),
    (["bench"], 2, "odpwatch bench: say what to measure: memwatch, odp, cache, ucx, wire or mpi"),
    (["bench", "nosuch"], 2, "odpwatch bench: say what to measure"),
    (["bench", "cache", "--reps", "0"], 2,
     "odpwatch bench cache: --reps wants a number from 1 to 10000, not '0'"),
    (["bench", "cache", "--reps", "5x"], 2, "--reps wants a number from 1 to 10000, not '5x'"),
    (["bench", "cache", "--reps", "-3"], 2, "--reps wants a number from 1 to 10000, not '-3'"),
    (["bench", "cache", "--reps", "99999999999999999999"], 2,
     "--reps wants a number from 1 to 10000, not '99999999999999999999'"),
    (["bench", "cache", "--reps"], 2, "odpwatch bench cache: missing value for --reps"),
    (["bench", "wire", "--peer"], 2, "odpwatch bench wire: missing value for --peer"),
    (["bench", "cache", "--peer", "x"], 2, "odpwatch bench cache: bad argument --peer"),
    (["bench", "cache", "--csv", "/proc/nope/x.csv"], 2,
     "odpwatch bench: cannot write --csv /proc/nope/x.csv: No such file or directory"),
    (["bench", "cache", "--only", "nosuch"], 1,
     "odpwatch bench: --only nosuch matches no section of bench cache ("),
    (["bench", "memwatch", "--serve"], 2, "odpwatch bench memwatch: bad argument --serve"),
    (["bench", "wire"], 2, "odpwatch bench wire: give --peer ADDR (node 0) or --serve (node 1)"),
    (["bench", "wire", "--serve", "--peer", "x"], 2, "give --peer ADDR (node 0) or --serve"),
    (["bench", "mpi"], 2, "odpwatch bench mpi: give --peer ADDR (node 0 of the cluster)"),
    (["bench", "mpi", "--serve"], 2, "odpwatch bench mpi: bad argument --serve"),
])
def test_bad_input_gets_its_exact_error(args, rc, err):
    """Every command and option, misused: a clear message on stderr, the
    usage exit status (2) or a failure (1), nothing written to stdout but
    the usage, no crash."""
    r = subprocess.run([ODPWATCH, *args], capture_output=True, text=True, timeout=120)
    assert (r.returncode, err in r.stderr) == (rc, True), (r.returncode, r.stderr)
    assert "terminate called" not in r.stderr and "Traceback" not in r.stderr


def test_help_goes_to_stdout():
    r = subprocess.run([ODPWATCH, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: odpwatch") and not r.stderr
