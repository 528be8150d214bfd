# SPDX-License-Identifier: GPL-2.0
"""NVMe over fabrics across the wire: nvmet's RDMA target (configfs) on
one node, the kernel's nvme-rdma host (nvme-cli) on the other, data written
and verified by fio, once with the target's queues on one shared receive
queue (use_srq) and once without; the same over TCP for the comparison; a
target that goes away in the middle of I/O, and comes back."""
import json
import os
import re
import signal
import subprocess
import time
import uuid

import pytest

from conftest import NQN, d_state_tasks, record, throughput, verify, wait_for

# Which node's target runs with use_srq as named (the kernel command lines
# of run.sh's kernel-ulps stage).
TARGET_OF = {"srq_off": 1, "srq_on": 0}
# A controller that loses its target gives up on I/O after FAST_FAIL
# seconds and on itself after LOSS (reconnect attempts a second apart);
# keep-alive every 30 s, not 5: a guest under TCG beside another can be
# late by seconds.
FAST_FAIL, LOSS = 5, 30


def nvme_connect(host, target, trtype="rdma", svcid=4420, extra=""):
    """Connect @host to @target's subsystem: the controller's name (nvmeN)."""
    hostnqn = f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid4()}"
    host.run(f"nvme connect -t {trtype} -a {target.addr} -s {svcid} -n {NQN} --hostnqn={hostnqn} "
             f"-k 30 -c 1 -l {LOSS} {extra}", timeout=120)
    ctrls = controllers(host, trtype)
    assert len(ctrls) == 1, f"{host}: after nvme connect, controllers of {NQN} over {trtype}: {ctrls}"
    return ctrls[0]


def controllers(host, trtype):
    out, _ = host.run(f"for c in /sys/class/nvme/nvme*; do [ -e $c/subsysnqn ] || continue; "
                      f"[ \"$(cat $c/subsysnqn)\" = {NQN} ] && [ \"$(cat $c/transport)\" = {trtype} ] "
                      f"&& echo ${{c##*/}}; done", check=False)
    return out.split()


def namespaces(host, ctrl):
    """The block devices of @ctrl by namespace id: {1: /dev/nvme0n1, ...}."""
    out, _ = host.run(f"cd /sys/class/nvme/{ctrl} && for d in nvme*n*; do "
                      f"[ -e $d/nsid ] && echo $d $(cat $d/nsid); done", check=False)
    found = {}
    for line in out.splitlines():
        name, nsid = line.split()
        found[int(nsid)] = f"/dev/{name}"
    return found


def wait_namespaces(host, ctrl):
    wait_for(f"{host}: {ctrl}'s two namespaces", lambda: len(namespaces(host, ctrl)) == 2, 30)
    devs = namespaces(host, ctrl)
    wait_for(f"{host}: the device nodes of {devs}",
             lambda: host.run(" && ".join(f"[ -b {d} ]" for d in devs.values()), check=False)[1] == 0, 30)
    return devs


def nvmet_srqs(target):
    """The SRQs the kernel's nvmet_rdma holds on @target's rxe0."""
    out, _ = target.run("rdma -j resource show srq", check=False)
    try:
        entries = json.loads(out or "[]")
    except json.JSONDecodeError:
        pytest.fail(f"{target}: rdma resource show srq printed no JSON:\n{out}")
    return [e for e in entries if "nvmet" in e.get("comm", "")]


class TestSrqOffAndOn:
    """Each test once per target: use_srq off, then on (the fixtures are
    the class's, so the last one's target is gone before the next tests)."""

    @pytest.fixture(scope="class", params=list(TARGET_OF))
    def fabric(self, request, nodes):
        """A target with an RDMA port (4420) on one node, use_srq as the
        parameter names; its host is the other node."""
        target = nodes[TARGET_OF[request.param]]
        host = nodes[1 - target.n]
        want = "Y" if request.param == "srq_on" else "N"
        got = target.param("/sys/module/nvmet_rdma/parameters/use_srq")
        assert got == want, f"{target} booted with nvmet_rdma.use_srq={got}, not {want}"
        target.run("/odpwatch/kernel-ulps/nvmet.sh setup")
        target.run(f"/odpwatch/kernel-ulps/nvmet.sh port 1 rdma {target.addr} 4420")
        state = {"mode": request.param, "target": target, "host": host, "ctrl": None}
        yield state
        if state["ctrl"]:
            host.run(f"nvme disconnect -d {state['ctrl']}", check=False)
        target.run("/odpwatch/kernel-ulps/nvmet.sh teardown")

    @pytest.fixture(scope="class")
    def connected(self, fabric):
        """The host connected over RDMA: its namespaces {nsid: device}."""
        fabric["ctrl"] = nvme_connect(fabric["host"], fabric["target"])
        fabric["devs"] = wait_namespaces(fabric["host"], fabric["ctrl"])
        return fabric

    def test_target_queues_use_srq_as_configured(self, connected):
        """With use_srq the target's I/O queues share SRQs (one per
        completion vector: one in a guest of one CPU); without, there is none."""
        srqs = nvmet_srqs(connected["target"])
        on = connected["mode"] == "srq_on"
        assert (len(srqs) >= 1) if on else not srqs, f"{connected['target']}: nvmet's SRQs {srqs}"

    @pytest.mark.parametrize("qd", [1, 16, 64])
    def test_random_writes_read_back_verified_null_blk(self, connected, qd):
        """fio's crc32c verification of random writes of 4 to 64 KiB, some
        sent inline with the command and the rest read by the target with RDMA
        READ, on the memory-backed null_blk namespace."""
        size = "4M" if qd == 1 else "8M"
        n = verify(connected["host"], connected["devs"][1], size, qd)
        record("nvme-rdma", connected["mode"], f"null_blk qd{qd}", "bytes verified", n)

    def test_random_writes_read_back_verified_file(self, connected):
        """The same on the file namespace (a file on the target's tmpfs)."""
        n = verify(connected["host"], connected["devs"][2], "8M", 16, bs="4k-128k")
        record("nvme-rdma", connected["mode"], "file qd16", "bytes verified", n)

    def test_disconnect_frees_the_target_queues(self, connected):
        """nvme disconnect, and the target lets go of its queues and SRQ
        within 20 s of it. With use_srq each queue's drain waits for rxe's
        Last WQE Reached event: a missing one costs 60 s per queue, on the
        target (the host's disconnect does not wait for it)."""
        host, target = connected["host"], connected["target"]
        t0 = time.monotonic()
        host.run(f"nvme disconnect -d {connected['ctrl']}", timeout=120)
        host_took = time.monotonic() - t0
        connected["ctrl"] = None
        assert not controllers(host, "rdma")
        wait_for(f"{target}: nvmet's SRQ and QPs released", lambda: not nvmet_srqs(target) and "nvmet" not in
                 target.run("rdma resource show qp", check=False)[0], 60)
        took = time.monotonic() - t0
        record("nvme-rdma", connected["mode"], "disconnect (host)", "seconds", f"{host_took:.1f}")
        record("nvme-rdma", connected["mode"], "target queues released", "seconds", f"{took:.1f}")
        assert took < 20, f"{target}: its queues were released {took:.1f} s after the disconnect"


@pytest.mark.parametrize("trtype", ["rdma", "tcp"])
def test_throughput_beside_tcp(nodes, trtype):
    """Sequential writes and reads of 128 KiB at queue depth 16 over each
    transport on the same wire (node 1's target, no SRQ): recorded in the
    suite's table; each must move all its bytes."""
    target, host = nodes[1], nodes[0]
    target.run("/odpwatch/kernel-ulps/nvmet.sh setup")
    ctrl = None
    try:
        port = 4420 if trtype == "rdma" else 4421
        target.run(f"/odpwatch/kernel-ulps/nvmet.sh port 1 {trtype} {target.addr} {port}")
        ctrl = nvme_connect(host, target, trtype, port)
        dev = wait_namespaces(host, ctrl)[1]
        for rw in ("write", "read"):
            record("nvme", trtype, f"sequential {rw} 128k qd16", "MiB/s",
                   f"{throughput(host, dev, rw):.1f}")
    finally:
        if ctrl:
            host.run(f"nvme disconnect -d {ctrl}", check=False)
        target.run("/odpwatch/kernel-ulps/nvmet.sh teardown")


def test_target_lost_mid_io_then_back(nodes):
    """The target's port goes away under random writes at queue depth 16:
    the host's I/O fails with an error within fast_io_fail_tmo (no task
    hangs); the port comes back and the host reconnects by itself and
    verifies; it goes away again and the host deletes the controller after
    ctrl_loss_tmo. The consoles are checked for splats by the harness."""
    target, host = nodes[1], nodes[0]
    target.run("/odpwatch/kernel-ulps/nvmet.sh setup")
    ctrl = None
    try:
        target.run(f"/odpwatch/kernel-ulps/nvmet.sh port 1 rdma {target.addr} 4420")
        ctrl = nvme_connect(host, target, extra=f"--fast_io_fail_tmo={FAST_FAIL}")
        dev = wait_namespaces(host, ctrl)[1]
        job = host.start(f"cd /tmp && exec fio --name=lost --filename={dev} --ioengine=libaio --direct=1 "
                         f"--rw=randwrite --bs=16k --iodepth=16 --time_based --runtime=120")
        time.sleep(5)
        assert job.poll() is None, f"fio ended before the target went away:\n{job.communicate()[0]}"
        target.run("/odpwatch/kernel-ulps/nvmet.sh unport 1")
        t0 = time.monotonic()
        try:
            out, _ = job.communicate(timeout=FAST_FAIL + 40)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            pytest.fail(f"{host}: fio still running {FAST_FAIL + 40} s after the target went away; "
                        f"tasks in D state: {d_state_tasks(host)}")
        failed_after = time.monotonic() - t0
        assert job.returncode != 0 and re.search(r"error|Input/output", out), \
            f"{host}: fio exited {job.returncode} with the target gone:\n{out[-2000:]}"
        # fast_io_fail_tmo, and room for a guest under TCG.
        assert failed_after < FAST_FAIL + 10, f"{host}: I/O failed {failed_after:.1f} s after the target went"
        assert not d_state_tasks(host), f"{host}: tasks in D state: {d_state_tasks(host)}"
        record("nvme-rdma", "target lost", "I/O failed after", "seconds", f"{failed_after:.1f}")
        # Back within ctrl_loss_tmo: the host reconnects on its own.
        target.run(f"/odpwatch/kernel-ulps/nvmet.sh port 1 rdma {target.addr} 4420")
        took = wait_for(f"{host}: {ctrl} live again",
                        lambda: host.param(f"/sys/class/nvme/{ctrl}/state") == "live", LOSS + 10)
        record("nvme-rdma", "target back", "reconnected after", "seconds", f"{took:.1f}")
        verify(host, wait_namespaces(host, ctrl)[1], "8M", 16, name="after-reconnect")
        # Gone for good: the controller is deleted after ctrl_loss_tmo.
        target.run("/odpwatch/kernel-ulps/nvmet.sh unport 1")
        t1 = time.monotonic()
        wait_for(f"{host}: {ctrl} deleted after ctrl_loss_tmo {LOSS} s",
                 lambda: not controllers(host, "rdma"), 2 * LOSS + 30, step=1)
        ctrl = None
        record("nvme-rdma", "target gone", "controller deleted after", "seconds",
               f"{time.monotonic() - t1:.1f}")
        assert not d_state_tasks(host), f"{host}: tasks in D state: {d_state_tasks(host)}"
    finally:
        if ctrl:
            host.run(f"nvme disconnect -d {ctrl}", check=False)
        target.run("/odpwatch/kernel-ulps/nvmet.sh teardown", check=False)
