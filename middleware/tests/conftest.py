# SPDX-License-Identifier: GPL-2.0
"""The middleware suite, run on node 0 of the two-guest cluster: Debian's own
Open MPI, MPICH and UCX, unmodified, across the two kernels. Both nodes
run sshd with the root filesystem's key pair, so mpirun and mpiexec start
their remote daemons over ssh on the wire, as on any cluster."""
import contextlib
import os
import re
import subprocess
import threading
import time

BIN = "/out/guest/bin"
HOSTS = "odpwatch-node0,odpwatch-node1"

# UCX on rxe, as a user must configure it (each setting found in the field):
# - rc_verbs needs ud_verbs beside it to set up its connections;
# - UCX's UD checks the destination address of each packet where the CQE's
#   SL says the network header is (an mlx5 convention); rxe reports SL 0,
#   so every packet would be dropped without ETH_DGID_CHECK=n;
# - UCX's cost model for rxe picks copy protocols for all sizes: the
#   rendezvous threshold and a zero-copy scheme make it send from the
#   user's buffer, through its registration cache, as it does on hardware.
UCX = {
    "UCX_NET_DEVICES": "rxe0:1",
    "UCX_TLS": "rc_verbs,ud_verbs,self",
    "UCX_UD_VERBS_ETH_DGID_CHECK": "n",
    "UCX_RNDV_THRESH": "16k",
    "UCX_RNDV_SCHEME": "get_zcopy",
}
# UCX registers host memory on demand (ODP) instead of pinning it.
ODP = {"UCX_REG_NONBLOCK_MEM_TYPES": "host"}
# Open MPI over libfabric (pml cm, mtl ofi) on rxe: ofi_rxm sizes its verbs
# CQ as (rx + tx queue) x FI_UNIVERSE_SIZE, 256 by default: 65536 entries,
# beyond rxe's max_cqe (32767), and no pml opens ("Unable to create verbs
# CQ"). Two ranks need far less.
OFI = {"FI_PROVIDER": "verbs;ofi_rxm", "FI_UNIVERSE_SIZE": "16"}
# libfabric's own MR cache with memwatch as its monitor (libodpwatch-ofi),
# its counters printed at exit; or the verbs provider's registrations on
# demand.
MEMWATCH_OFI = {"LD_PRELOAD": "/out/guest/lib/libodpwatch-ofi-preload.so",
                "ODPWATCH_OFI_DEBUG": "1"}
ODP_OFI = {"FI_VERBS_USE_ODP": "1"}
# Debian's UCX, unmodified, told of every change to a cached registration by
# memwatch (libodpwatch-ucx-preload.so), its counters printed at exit.
MEMWATCH_UCX = {"LD_PRELOAD": "/out/guest/lib/libodpwatch-ucx-preload.so",
                "ODPWATCH_UCX_DEBUG": "1"}

RESULT = re.compile(r"stale_send: way=(\w+) size=(\d+) messages=(\d+) corrupt=(\d+)")
SENDER = re.compile(r"stale_send: sender way=(\w+) not_freed=(\d+) elsewhere=(\d+)")
MONITOR = re.compile(r"stale_send: rank \d+ way=(\w+) monitor_hits=(\d+)")
UCX_REGS = re.compile(r"stale_send: rank (\d+) way=(\w+) registrations=(\d+)")


def run(cmd, env=None, timeout=300):
    """Run @cmd; its output (stdout and stderr) and exit status."""
    e = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    e.update(env or {})
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    return p.stdout, p.returncode


def openmpi(program, args, env, pml="ucx", timeout=300):
    """mpirun of Open MPI: one rank per node; UCX settings passed with -x."""
    cmd = ["mpirun.openmpi", "--host", HOSTS, "-np", "2", "--map-by", "node",
           "--prtemca", "oob_tcp_if_include", "eth0", "--mca", "pml", pml]
    if pml == "ob1":
        cmd += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "eth0"]
    if pml == "cm":
        cmd += ["--mca", "mtl", "ofi"]
    for k, v in env.items():
        cmd += ["-x", f"{k}={v}"]
    return run(cmd + [program] + args, timeout=timeout)


def mpich(program, args, env, timeout=300):
    """mpiexec of MPICH (hydra over ssh): one rank per node."""
    cmd = ["mpiexec.mpich", "-launcher", "ssh", "-hosts", HOSTS, "-n", "2", "-ppn", "1"]
    for k, v in env.items():
        cmd += ["-genv", k, v]
    return run(cmd + [program] + args, timeout=timeout)


def stale_send(mpi, way, size, count, env, **kw):
    """Run stale_send with Open MPI ("openmpi") or MPICH ("mpich"); the
    number of corrupt messages rank 1 saw. (How many times the kernel kept
    the pages, refusing a move or not dropping them, is in last_not_freed.)

    group: the ways of freeing one job runs, one after the other, each at
    an address of its own (an mpirun costs seconds of launch over ssh); the
    first test of a group runs the job, the others take their way's result.
    sample_odp: sample the MRs on demand while the job runs (last_odp_most).
    A job that failed, timed out or was interrupted fails every test of its
    group at once, without running again."""
    global last_output, last_not_freed, last_elsewhere, last_odp_most, last_monitor_hits
    global last_ucx_registrations
    group = tuple(kw.pop("group", (way,)))
    assert way in group, (way, group)
    key = (mpi, group, size, count, tuple(sorted(env.items())), tuple(sorted(kw.items())))
    if key not in _jobs:
        try:
            _jobs[key] = _stale_send_job(mpi, group, size, count, env, **kw)
        except BaseException as e:  # a timeout, pytest-timeout's too
            _jobs[key] = f"{mpi} stale_send job of {','.join(group)} failed: {e!r}"
            raise
    job = _jobs[key]
    assert not isinstance(job, str), job
    last_output, last_odp_most = job["output"], job["odp_most"]
    corrupt, last_not_freed, last_elsewhere = job[way]
    last_monitor_hits = job["monitor_hits"].get(way)
    last_ucx_registrations = job["ucx_registrations"].get(way, {})
    return corrupt


_jobs = {}  # stale_send's jobs: their results by way, or why they failed


def _stale_send_job(mpi, group, size, count, env, **kw):
    asan = kw.pop("asan", False)  # False, or the ASAN_OPTIONS of a run of the ASan build
    sample_odp = kw.pop("sample_odp", False)
    program = f"{BIN}/stale_send.{'asan.' if asan else ''}{mpi}"
    if "go" in group:  # the Go program (middleware/mpi/go/), Go's runtime frees
        assert group == ("go",), "the Go program runs the way go alone"
        assert not asan, "no ASan build of the Go program"
        program = f"{BIN}/stale_send_go.{mpi}"
    args = [",".join(group), str(size), str(count)]
    if asan:
        # MPI's allocations live to the end: leaks are not this test's.
        # Open MPI's memory patcher rewrites mprotect(), which ASan
        # intercepts, and the rank dies in MPI_Init (SIGILL): off, as an
        # ASan user of Open MPI must turn it.
        env = {**env, "ASAN_OPTIONS": f"detect_leaks=0:{asan}", "OMPI_MCA_memory": "^patcher"}
    deny = kw.pop("deny", None)
    if deny:
        # Each rank under a seccomp filter answering @deny with EPERM, as a
        # container runtime's profile answers what it does not allow.
        program, args = f"{BIN}/odpwatch-seccomp-deny", ["EPERM", deny, program] + args
    sampler = OdpSampler()
    with sampler if sample_odp else contextlib.nullcontext():
        # Below pytest's 600 s per test, so that a hung job is this
        # test's failure, reported with its output.
        out, rc = (openmpi if mpi == "openmpi" else mpich)(
            program, args, env, timeout=min(120 + 60 * len(group), 540), **kw)
    job = {"output": out, "odp_most": sampler.most, "monitor_hits": {}, "ucx_registrations": {}}
    for m in MONITOR.finditer(out):
        job["monitor_hits"][m[1]] = job["monitor_hits"].get(m[1], 0) + int(m[2])
    for m in UCX_REGS.finditer(out):
        job["ucx_registrations"].setdefault(m[2], {})[int(m[1])] = int(m[3])
    results = {m[1]: m for m in RESULT.finditer(out)}
    senders = {m[1]: m for m in SENDER.finditer(out)}
    on_demand = ODP.items() <= env.items() or ODP_OFI.items() <= env.items()
    memwatch = env.get("LD_PRELOAD") in (MEMWATCH_OFI["LD_PRELOAD"], MEMWATCH_UCX["LD_PRELOAD"])
    for way in group:  # the rows of the ways that reported, even if a later one failed
        m, sender = results.get(way), senders.get(way)
        if not (m and sender and (int(m[2]), int(m[3])) == (size, count)):
            continue
        job[way] = (int(m[4]), int(sender[2]), int(sender[3]))
        record(mpi + (f" (ASan build, {asan})" if asan else ""),
               {"cm": "cm (mtl ofi)"}.get(kw.get("pml"), kw.get("pml", "ucx")),
               ("on demand" if on_demand else "pinned + memwatch" if memwatch else "pinned")
               + (f" ({deny} refused by seccomp)" if deny else ""),
               way, size, count, *job[way])
    if rc != 0 or any(way not in job for way in group):
        return f"{mpi} stale_send {' '.join(args)}: status {rc}\n{out[-3000:]}"
    return job


last_output = ""  # of the last stale_send job
last_not_freed = 0
last_elsewhere = 0  # times the next buffer landed at another address (way "free")
last_odp_most = 0  # the most MRs on demand seen while the job ran (sample_odp)
last_monitor_hits = None  # memwatch's libfabric monitor's hits in the way, both ranks
last_ucx_registrations = {}  # rank: pinned registrations UCX made in the way (libodpwatch-ucx)


def ofi_monitor_stats(out):
    """The memwatch monitor's counters each rank printed at exit, summed."""
    rows = re.findall(r"odpwatch-ofi: stats subscribes=(\d+) hits=(\d+) stale=(\d+)", out)
    return {"ranks": len(rows), "subscribes": sum(int(r[0]) for r in rows),
            "hits": sum(int(r[1]) for r in rows)}


def record(*row):
    """One line of the matrix (run-middleware-suite.sh names the file)."""
    path = os.environ.get("ODPWATCH_MIDDLEWARE_MATRIX")
    if path:
        with open(path, "a") as f:
            f.write("\t".join(map(str, row)) + "\n")


class OdpSampler:
    """Samples `odpwatch mr-counters` every second while it is entered: the
    most MRs on demand it saw on this node."""

    def __init__(self):
        self.most, self.samples, self._stop = 0, 0, threading.Event()

    def _loop(self):
        while not self._stop.wait(1.0):
            out, _ = run([f"{BIN}/odpwatch", "mr-counters"], timeout=30)
            m = re.search(r"(\d+) MRs, (\d+) on demand", out)
            if m:
                self.samples += 1
                self.most = max(self.most, int(m[2]))

    def __enter__(self):
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

