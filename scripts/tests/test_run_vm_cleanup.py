# SPDX-License-Identifier: GPL-2.0
"""Self-test of run-vm.sh's cleanup: whatever ends a guest run (Ctrl-C,
kill, the make that started it going away) must end the QEMU it started.
QEMU is stood in for by a program on PATH that records its PID and sleeps."""
import os
import signal
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

RUN_VM = Path(__file__).resolve().parent.parent / "run-vm.sh"

# The PID file appears whole (written aside, then renamed): the test polls
# for it, and a shell's ">" creates it empty before the echo fills it.
FAKE_QEMU = """#!/bin/sh
echo $$ >"$FAKE_QEMU_PIDFILE.tmp"
mv "$FAKE_QEMU_PIDFILE.tmp" "$FAKE_QEMU_PIDFILE"
exec sleep 1000
"""


def alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(cond, seconds=15):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


class RunVmCleanup(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="odpwatch-run-vm-test.")
        d = Path(self.tmp.name)
        (d / "bin").mkdir()
        fake = d / "bin" / "qemu-system-x86_64"
        fake.write_text(FAKE_QEMU)
        fake.chmod(0o755)
        self.pidfile = d / "qemu.pid"
        self.env = dict(os.environ, PATH=f"{d / 'bin'}:{os.environ['PATH']}", FAKE_QEMU_PIDFILE=str(self.pidfile),
                        ODPWATCH_OUT=str(d / "out"), ODPWATCH_CACHE=str(d / "cache"), TIMEOUT="600")
        self.env.pop("ODPWATCH_LEADER", None)

    def tearDown(self):
        if self.pidfile.exists() and alive(int(self.pidfile.read_text())):
            os.kill(int(self.pidfile.read_text()), signal.SIGKILL)
        self.tmp.cleanup()

    def start(self, **env):
        # SIGINT as a terminal delivers it: a make started in the background
        # of a non-interactive shell ignores SIGINT, its children inherit
        # that, and bash cannot trap a signal ignored on entry.
        p = subprocess.Popen([str(RUN_VM), "vm", "vm", "/nonexistent/bzImage", "/nonexistent/rootfs"],
                             env=dict(self.env, **env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # A test that fails early must not leave run-vm.sh behind.
        self.addCleanup(lambda: (p.poll() is None and p.kill(), p.communicate()))
        self.assertTrue(wait_for(self.pidfile.exists), "the stand-in QEMU never started")
        qemu = int(self.pidfile.read_text())
        self.assertTrue(alive(qemu))
        return p, qemu

    def check_stopped(self, p, qemu):
        _, self.stderr = p.communicate(timeout=20)
        self.assertTrue(wait_for(lambda: not alive(qemu)), f"QEMU (pid {qemu}) was left running")

    def test_sigint_stops_qemu(self):
        p, qemu = self.start()
        p.send_signal(signal.SIGINT)
        self.check_stopped(p, qemu)
        self.assertEqual(p.returncode, 130)

    def test_sigterm_stops_qemu(self):
        p, qemu = self.start()
        p.terminate()
        self.check_stopped(p, qemu)

    def test_leader_gone_stops_qemu(self):
        # The leader stands in for the make that started the run, killed
        # with SIGKILL (no trap of ours runs in it).
        leader = subprocess.Popen(["sleep", "1000"])
        p, qemu = self.start(ODPWATCH_LEADER=str(leader.pid))
        leader.kill()
        leader.wait()
        self.check_stopped(p, qemu)
        self.assertIn(b"leader", self.stderr)


if __name__ == "__main__":
    unittest.main()
