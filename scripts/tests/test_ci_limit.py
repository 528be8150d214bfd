# SPDX-License-Identifier: GPL-2.0
"""Self-test of .ci/run's hard limit: a make check still running past it is
stopped, the run fails, and the stages that took the time are named (the
finished ones from the ledger, and the one it was in). make is stood in for
by a program on PATH that writes a ledger as scripts/lib.sh's stage() does,
then hangs."""
import os
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

CI_RUN = Path(__file__).resolve().parent.parent.parent / ".ci" / "run"

FAKE_MAKE = """#!/bin/sh
printf '0\\tkernel build (std)\\t1234\\t900\\t0\\n0\\tlint\\t12\\t120\\t0\\n' >"$ODPWATCH_OUT/.stages"
printf '0\\t%s\\tboot and run the suites\\n' "$(date +%s)" >"$ODPWATCH_OUT/.stage-now.main"
echo $$ >"$FAKE_MAKE_PIDFILE.tmp"
mv "$FAKE_MAKE_PIDFILE.tmp" "$FAKE_MAKE_PIDFILE"
exec sleep 1000
"""


class CiHardLimit(unittest.TestCase):
    def test_a_run_past_the_hard_limit_is_stopped_and_fails(self):
        with tempfile.TemporaryDirectory(prefix="odpwatch-ci-test.") as tmp:
            d = Path(tmp)
            (d / "bin").mkdir()
            (d / "out").mkdir()
            fake = d / "bin" / "make"
            fake.write_text(FAKE_MAKE)
            fake.chmod(0o755)
            pidfile = d / "make.pid"
            env = dict(os.environ, PATH=f"{d / 'bin'}:{os.environ['PATH']}", ODPWATCH_OUT=str(d / "out"),
                       ODPWATCH_CACHE=str(d / "cache"), ODPWATCH_CI_HARD_LIMIT="3",
                       FAKE_MAKE_PIDFILE=str(pidfile))
            t0 = time.monotonic()
            r = subprocess.run([str(CI_RUN)], env=env, capture_output=True, text=True, timeout=120)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 1, out)
            self.assertLess(time.monotonic() - t0, 60, out)
            self.assertIn("HARD LIMIT", out)
            self.assertIn("kernel build (std)", out)
            self.assertIn("stage over budget: kernel build (std): 1234s > 900s", out)
            self.assertIn("stage still running: boot and run the suites", out)
            # The stand-in and everything it started are gone.
            pid = int(pidfile.read_text())
            self.assertFalse(Path(f"/proc/{pid}").exists() and
                             Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z",
                             "the stopped make is still running")


if __name__ == "__main__":
    unittest.main()
