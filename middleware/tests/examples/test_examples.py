# SPDX-License-Identifier: GPL-2.0
"""The examples suite: clients that others wrote and users already run,
across the two kernels, each with its own check of the data.

Node 1 runs the server side over ssh, node 0 the client; every pair is
bounded (the server by timeout(1), the client by run()'s timeout) and a
failure names the side and shows both outputs. What each program checks:
ibv_*_pingpong -c: the first byte of every page of each message (rdma-core's
own check: weak, but theirs); rping -V: every byte of each RDMA READ and
WRITE; rstream and riostream -T v: every byte of each transfer; io_demo -q:
every byte of each READ and WRITE, and each transaction's id; qperf and
mpi4py's pingpong carry no check and show that the transports run at all."""
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import UCX, ODP, openmpi, run

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "pyverbs-tests"))
from rxe_env import roce_v2_ipv4_gid  # noqa: E402

PEER = "odpwatch-node1"
PEER_ADDR = "198.51.100.11"
LIMIT = 240  # seconds, for either side of a pair
# What a client says when its server is not listening yet: it is started
# again.
REFUSED = ("Couldn't connect", "Connection refused", "rdma_connect", "unreachable",
           "failed to connect", "REJECTED", "Destination is unreachable")
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", PEER]


def stop_server(pid):
    """TERM to the server's timeout(1) on node 1, which passes it on."""
    subprocess.run(SSH + [f"kill -TERM {pid}"], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)


@pytest.fixture(scope="module")
def gid():
    """The index of rxe0's RoCE v2 GID of its IPv4 address (the same on both nodes)."""
    return str(roce_v2_ipv4_gid("rxe0")[0])


def pair(server, client, env=None, serves_on=False, settle=0):
    """@server on node 1 (over ssh), then @client on node 0 (@settle seconds
    after the server started, for a server that takes a refused connection
    as its one client), retried while the server is not yet listening (an
    output with one of REFUSED). A server that @serves_on after its client
    (it has no way to be told to end) is stopped then, by its PID, and its
    status counts as 0 if it ended by that signal. Both outputs and exit
    statuses."""
    env = env or {}
    command = " ".join(["timeout", str(LIMIT), "env"] + [shlex.quote(f"{k}={v}") for k, v in env.items()]
                       + [shlex.quote(a) for a in server])
    # The remote shell says its PID, then becomes timeout(1): a TERM to that
    # PID ends the server too.
    srv = subprocess.Popen(SSH + [f"echo server-pid $$; exec {command}"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
    pid = None
    try:
        first = srv.stdout.readline()
        m = re.match(r"server-pid (\d+)$", first.strip())
        assert m, f"the server's ssh to {PEER} did not start it: {first!r}"
        pid = m[1]
        # The rest of its output, read beside: communicate() after
        # readline() would miss what the text layer already buffered.
        chunks = []
        reader = threading.Thread(target=lambda: chunks.append(srv.stdout.read()), daemon=True)
        reader.start()
        time.sleep(settle)
        deadline = time.monotonic() + 60
        while True:
            out, rc = run(client, env=env, timeout=LIMIT)
            if rc == 0 or srv.poll() is not None or time.monotonic() > deadline or \
                    not any(r in out for r in REFUSED):
                break
            time.sleep(1)
        # A server that serves on, or whose client failed, is not waited for.
        stop = serves_on or rc != 0
        if stop:
            try:
                srv.wait(timeout=5)
            except subprocess.TimeoutExpired:
                stop_server(pid)
        late = ""
        try:
            srv.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
            late = f"\n[the server on {PEER} did not end within {LIMIT} s of the client]"
        reader.join(timeout=30)
        sout = "".join(chunks) + late
    finally:
        if srv.poll() is None:
            # The client's run() timed out, or the test failed: end the
            # server too, so that it cannot answer the next case.
            if pid:
                stop_server(pid)
            srv.kill()
            srv.wait()
    # Ended by our TERM: timeout(1) exits 124, or ssh reports the signal (255).
    src = 0 if serves_on and srv.returncode in (124, 143, 255) else srv.returncode
    return out, rc, sout, src


def check_pair(name, res):
    out, rc, sout, src = res
    assert rc == 0 and src == 0, \
        f"{name}: client status {rc}, server status {src}\n--- client:\n{out[-2500:]}\n--- server:\n{sout[-2500:]}"
    return out, sout


# Each ibv_*_pingpong case: its options (both sides), a port of its own so a
# server left by a failed case cannot answer the next one.
PINGPONG = {
    "rc": ("ibv_rc_pingpong", ["-s", "16384", "-n", "300"]),
    "rc-odp": ("ibv_rc_pingpong", ["-s", "16384", "-n", "300", "-o"]),
    "rc-odp-prefetch": ("ibv_rc_pingpong", ["-s", "16384", "-n", "300", "-o", "-P"]),
    "rc-implicit-odp": ("ibv_rc_pingpong", ["-s", "16384", "-n", "300", "-O"]),
    "rc-implicit-odp-prefetch": ("ibv_rc_pingpong", ["-s", "16384", "-n", "300", "-O", "-P"]),
    "rc-events-new-send-api": ("ibv_rc_pingpong", ["-s", "4096", "-n", "300", "-e", "-N"]),
    "srq": ("ibv_srq_pingpong", ["-s", "4096", "-n", "100", "-q", "8"]),
    "srq-odp": ("ibv_srq_pingpong", ["-s", "4096", "-n", "100", "-q", "8", "-o"]),
    "ud": ("ibv_ud_pingpong", ["-s", "1024", "-n", "300"]),
    "uc": ("ibv_uc_pingpong", ["-s", "4096", "-n", "300"]),
}


@pytest.mark.parametrize("case", PINGPONG)
def test_pingpong(case, gid):
    """rdma-core's example clients, with their own data check (-c)."""
    prog, opts = PINGPONG[case]
    port = str(18600 + list(PINGPONG).index(case))
    args = [prog, "-d", "rxe0", "-g", gid, "-p", port, "-c"] + opts
    out, sout = check_pair(case, pair(args, args + [PEER]))
    n = opts[opts.index("-n") + 1]
    for side, text in (("client", out), ("server", sout)):
        # ibv_srq_pingpong counts each QP's exchanges: iters x QPs in all.
        assert re.search(r"\d+ iters in [\d.]+ seconds", text), f"{case}: the {side} reported no exchanges:\n{text}"
        assert "Invalid" not in text and "Failed" not in text, f"{case} ({side}):\n{text}"
    # The client's own count (the server's is the same but for SRQ, where it
    # counts the exchanges of every QP).
    assert re.search(rf"^{n} iters in", out, re.M) or "-q" in opts, out


def test_rping_validates_every_byte():
    """librdmacm's rping: each ping is an RDMA READ of the client's buffer
    then an RDMA WRITE back, compared byte for byte (-V). 32 KiB: rping
    refuses 65536, the top of the range it names itself."""
    server = ["rping", "-s", "-a", PEER_ADDR, "-p", "7480", "-C", "200", "-S", "32768", "-V"]
    client = ["rping", "-c", "-a", PEER_ADDR, "-p", "7480", "-C", "200", "-S", "32768", "-V", "-v"]
    out, _ = check_pair("rping", pair(server, client))
    assert out.count("ping data:") == 200, out[-2000:]
    assert "mismatch" not in out, out[-2000:]


@pytest.mark.parametrize("prog", ["rstream", "riostream"])
def test_rsocket_streams_verify(prog):
    """rsockets (librdmacm's sockets over RDMA) with -T v: every byte of
    every transfer checked on receipt."""
    port = {"rstream": "7481", "riostream": "7482"}[prog]
    common = ["-p", port, "-S", "65536", "-C", "200", "-T", "v"]
    # The server serves one connection: a client that came too early and
    # was refused would end it. rsockets' listen has no port to probe.
    out, sout = check_pair(prog, pair([prog, "-b", PEER_ADDR] + common, [prog, "-s", PEER_ADDR] + common,
                                      settle=5))
    # One line of results per size: name, bytes, transfers, total, time, rate.
    assert re.search(r"64k\s+200\s", out), f"{prog} printed no result line:\n{out}"


IO_DEMO = ["io_demo", "-q", "-o", "read,write", "-d", "4096:262144", "-w", "8"]


@pytest.mark.parametrize("registration", ["pinned", "on-demand"])
def test_ucx_io_demo_checks_every_byte(registration):
    """UCX's io_demo with data integrity checks (-q): READs and WRITEs of
    4 KiB to 256 KiB, the larger by rendezvous from registered memory, pinned
    through UCX's registration cache or on demand."""
    env = {**UCX, **(ODP if registration == "on-demand" else {}), "UCX_LOG_LEVEL": "warn"}
    port = {"pinned": "7483", "on-demand": "7484"}[registration]
    server = IO_DEMO + ["-p", port]
    client = IO_DEMO + ["-p", port, "-i", "400", "-n", "60", PEER_ADDR]
    out, sout = check_pair(f"io_demo {registration}", pair(server, client, env=env, serves_on=True))
    assert "Client exit with status 'OK'" in out, out[-3000:]
    for side in (out, sout):
        assert "ERROR" not in side and "data corruption" not in side.lower(), side[-3000:]


@pytest.mark.parametrize("test", ["rc_bw", "rc_lat"])
def test_qperf(test):
    """qperf (its server on node 1) over rxe's RC, connected by the RDMA CM."""
    port = {"rc_bw": "19765", "rc_lat": "19766"}[test]
    server = ["qperf", "-lp", port]
    # -cm1: connect through the RDMA CM, by the peer's address (without it,
    # qperf's rc_bw client waited past its 240 s on rxe).
    client = ["qperf", "-cm1", "-lp", port, "-t", "3", "-m", "65536", PEER, test, "quit"]
    out, _ = check_pair(test, pair(server, client))
    m = re.search(r"(bw|latency)\s+=\s+([\d.]+) (\S+)", out)
    assert m and float(m[2]) > 0, f"qperf {test} measured nothing:\n{out}"


def test_mpi4py_pingpong_over_open_mpi():
    """mpi4py's own benchmark, one rank per node, Open MPI over UCX, with
    messages up to 1 MiB (rendezvous from registered memory)."""
    # Fewer rounds than its defaults (10000 a size), which take minutes under
    # QEMU; bytearrays, as the guest has no NumPy.
    args = ["-m", "mpi4py.bench", "pingpong", "-a", "none", "-m", "1", "-n", str(1 << 20),
            "-s", "10", "-l", "100", "--skip-large", "2", "--loop-large", "20"]
    out, rc = openmpi("python3", args, UCX)
    assert rc == 0, out[-3000:]
    sizes = [int(m) for m in re.findall(r"^\s*(\d+)\s+[\d.]+", out, re.M)]
    assert sizes and max(sizes) == 1 << 20, f"no result for 1 MiB messages:\n{out[-3000:]}"
