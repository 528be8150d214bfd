# SPDX-License-Identifier: GPL-2.0
"""The kernel-ulps suite, run on node 0 of the two-guest cluster: the
kernel's own RDMA users (NVMe over fabrics, NFS) across the two kernels,
set up with the tools a storage administrator uses (configfs, nvme-cli,
nfs-utils) and checked byte for byte by fio's verification.

Node 1 is driven over ssh. The two nodes boot with different settings of
nvmet_rdma's use_srq (a boot-time parameter of a built-in driver): node 1's
target has no SRQ, node 0's shares one SRQ among its queues, so the SRQ case
runs with the roles swapped."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ADDR = {0: "198.51.100.10", 1: "198.51.100.11"}
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
NQN = "nqn.2026-11.org.odpwatch:kernel-ulps"
# Each fio result, and each throughput, as a line of this table.
TABLE = os.environ.get("ODPWATCH_ULPS_TABLE")


class Node:
    """One guest: commands run here (node 0) or over ssh (node 1)."""

    def __init__(self, n):
        self.n = n
        self.addr = ADDR[n]
        self.local = n == int(os.environ.get("ODPWATCH_NODE", "0"))

    def __repr__(self):
        return f"node{self.n}"

    def argv(self, cmd):
        return ["sh", "-c", cmd] if self.local else SSH + [f"odpwatch-node{self.n}", cmd]

    def run(self, cmd, timeout=120, check=True):
        """@cmd's output (stdout and stderr) and status; a failure (when
        @check) or a timeout fails the test, naming the node. A command
        that times out is killed with everything it started (its process
        group: a shell's fio or cp, not only the shell)."""
        p = self.start(cmd)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            pytest.fail(f"{self}: '{cmd}' did not end within {timeout} s:\n{out[-3000:]}")
        if check and p.returncode != 0:
            pytest.fail(f"{self}: '{cmd}' exited {p.returncode}:\n{out[-3000:]}")
        return out, p.returncode

    def start(self, cmd):
        """@cmd in the background, in a process group of its own; a Popen
        whose output is text."""
        return subprocess.Popen(self.argv(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)

    def param(self, path):
        return self.run(f"cat {path}")[0].strip()


@pytest.fixture(scope="session")
def nodes():
    return {0: Node(0), 1: Node(1)}


def record(*fields):
    """A line of the suite's table (kind, case, MiB/s or bytes...)."""
    if TABLE:
        with open(TABLE, "a") as f:
            f.write("\t".join(str(x) for x in fields) + "\n")


def fio(node, args, timeout=300, check=True):
    """fio on @node with @args, its JSON result (None if it printed none),
    its status and its raw output. Run from /tmp: fio writes state files
    into its working directory, and /odpwatch is read-only."""
    cmd = "cd /tmp && fio --output-format=json --verify_state_save=0 " + " ".join(args)
    out, rc = node.run(cmd, timeout=timeout, check=False)
    start = out.find("{")
    try:
        res = json.loads(out[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        res = None
    if check and (rc != 0 or res is None):
        pytest.fail(f"{node}: fio {' '.join(args)} exited {rc}:\n{out[-3000:]}")
    return res, rc, out


def verify(node, target, size, qd, bs="4k-64k", name="verify", extra=()):
    """Random writes of @bs blocks over @size of @target at queue depth @qd,
    each block with a crc32c and a header naming its offset, then all of it
    read back and checked (verify_fatal: the first mismatch ends the run
    with an error). Every byte written must be read back."""
    args = [f"--name={name}", f"--filename={target}", "--ioengine=libaio", "--direct=1",
            "--rw=randwrite", f"--bsrange={bs}", f"--iodepth={qd}", f"--size={size}",
            "--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--randrepeat=0", *extra]
    res, _, out = fio(node, args)
    job = res["jobs"][0]
    assert job["error"] == 0, out[-3000:]
    written, read = job["write"]["io_bytes"], job["read"]["io_bytes"]
    want = parse_size(size)
    # fio writes the whole size once, then reads back what it wrote.
    assert written >= want and read >= written, \
        f"{node}: {target}: {written} bytes written and {read} read back and verified, of {want}:\n{out[-3000:]}"
    return written


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s)
    return int(m[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]


def throughput(node, target, rw, size="16M", extra=()):
    """Sequential @rw of 128 KiB at queue depth 16 through @target: MiB/s."""
    args = ["--name=bw", f"--filename={target}", "--ioengine=libaio", "--direct=1", f"--rw={rw}",
            "--bs=128k", "--iodepth=16", f"--size={size}", *extra]
    res, _, _ = fio(node, args)
    side = res["jobs"][0]["read" if rw == "read" else "write"]
    assert side["io_bytes"] >= parse_size(size)
    return side["bw_bytes"] / (1 << 20)


def d_state_tasks(node):
    """Tasks in uninterruptible sleep in two looks 3 s apart (one look also
    catches a task passing through I/O): their PID and command."""
    def look():
        out, _ = node.run("for f in /proc/[0-9]*/stat; do read -r l <$f 2>/dev/null && echo \"$l\"; done",
                          check=False)
        return {" ".join(line.split()[:2]) for line in out.splitlines()
                if len(line.split()) > 2 and line.split(")")[-1].split()[0] == "D"}
    first = look()
    if not first:
        return []
    time.sleep(3)
    return sorted(first & look())


def wait_for(what, cond, limit, step=0.5):
    """Poll @cond until it is true, at most @limit seconds: how long it took."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            pytest.fail(f"{what}: not within {limit} s")
        time.sleep(step)
    return time.monotonic() - t0
