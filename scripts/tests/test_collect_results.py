# SPDX-License-Identifier: GPL-2.0
"""Self-test of scripts/collect-results.py: it decides whether make check
passes, so each parser and the splat scan are checked on known inputs."""
import importlib.util
import io
import json
import tempfile
import unittest
import unittest.mock
from contextlib import redirect_stdout
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "collect_results", Path(__file__).resolve().parent.parent / "collect-results.py")
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)

KTAP = """TAP version 13
1..2
# timeout set to 45
# selftests: rxe_odp: rxe_odp_caps
# TAP version 13
# 1..3
# #  RUN           rxe.odp_caps ...
# ok 1 rxe.odp_caps
# not ok 2 rxe.odp_mr_untouched_buffer
# ok 3 rxe.implicit # SKIP no implicit ODP
not ok 1 selftests: rxe_odp: rxe_odp_caps # exit=1
# selftests: rxe_odp: crashes
not ok 2 selftests: rxe_odp: crashes # exit=139
"""

UNITTEST = """test_a (tests.test_odp.OdpTestCase.test_a) ... ok
test_b (tests.test_odp.OdpTestCase.test_b)
Check that something holds ... skipped 'Implicit ODP is not supported'
test_c (tests.test_odp.OdpTestCase.test_c) ... FAIL
test_d (tests.test_odp.OdpTestCase.test_d) ... ERROR

----------------------------------------------------------------------
Ran 4 tests in 1.0s

FAILED (failures=1, errors=1, skipped=1)
"""

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="test_harness" name="test_ok" time="0.1"/>
<testcase classname="test_harness" name="test_bad" time="0.1"><failure message="assert 1 == 2">x</failure></testcase>
<testcase classname="test_harness" name="test_skip" time="0.1"><skipped message="no device"/></testcase>
</testsuite></testsuites>
"""


def outcomes(tests):
    return {t["name"]: t["outcome"] for t in tests}


class Parsers(unittest.TestCase):
    def write(self, name, text):
        p = Path(self.dir.name) / name
        p.write_text(text)
        return p

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def test_ktap_nested_results_and_crashed_binary(self):
        got = outcomes(cr.parse_ktap(self.write("s.ktap", KTAP)))
        self.assertEqual(got, {
            "rxe_odp/rxe_odp_caps:rxe.odp_caps": "passed",
            "rxe_odp/rxe_odp_caps:rxe.odp_mr_untouched_buffer": "failed",
            "rxe_odp/rxe_odp_caps:rxe.implicit": "skipped",
            "rxe_odp/crashes": "failed",
        })

    def test_unittest_docstring_lines_and_outcomes(self):
        tests = cr.parse_unittest(self.write("rdma-core.test_odp.log", UNITTEST))
        self.assertEqual(outcomes(tests), {
            "tests.test_odp.OdpTestCase.test_a": "passed",
            "tests.test_odp.OdpTestCase.test_b": "skipped",
            "tests.test_odp.OdpTestCase.test_c": "failed",
            "tests.test_odp.OdpTestCase.test_d": "failed",
        })
        self.assertEqual(tests[1]["reason"], "Implicit ODP is not supported")

    def test_unittest_count_mismatch_fails(self):
        text = UNITTEST.replace("Ran 4 tests", "Ran 5 tests")
        self.assertIn("failed", [t["outcome"] for t in cr.parse_unittest(self.write("x.log", text))][4:])

    def test_unittest_crash_without_summary_fails(self):
        tests = cr.parse_unittest(self.write("x.log", "test_a (m.C.test_a) ... ok\nSegmentation fault\n"))
        self.assertEqual([t["outcome"] for t in tests], ["passed", "failed"])

    def test_junit(self):
        got = outcomes(cr.parse_junit(self.write("p.xml", JUNIT)))
        self.assertEqual(got, {"test_harness.test_ok": "passed", "test_harness.test_bad": "failed",
                               "test_harness.test_skip": "skipped"})

    def run_main(self, console, stock="test_a (tests.test_mr.M.test_a) ... ok\nRan 1 test in 0s\nOK\n"):
        d = Path(self.dir.name)
        self.write("selftests.ktap", "# selftests: a: b\n# ok 1 t\nok 1 selftests: a: b\n")
        self.write("pyverbs-tests.xml", JUNIT.replace("<failure", "<skipped").replace("</failure>", "</skipped>"))
        self.write("rdma-core.test_mr.log", "test_a (tests.test_mr.M.test_a) ... ok\nRan 1 test in 0s\nOK\n")
        if stock is not None:
            self.write("rdma-core-stock.test_mr.log", stock)
        self.write("console.log", console)
        out = io.StringIO()
        with redirect_stdout(out), unittest.mock.patch("sys.argv", ["x", str(d)]):
            rc = cr.main()
        return rc, out.getvalue(), json.loads((d / "results.json").read_text())

    def test_main_clean_console_passes(self):
        benign = ("odpwatch: kernel 7.3.4-odpwatch, 2 cpus\n"
                  "Kernel command line: console=ttyS0 panic=-1\n"
                  "kmemleak: Kernel memory leak detector initialized (mem pool available: 15000)\n")
        rc, out, res = self.run_main(benign)
        self.assertEqual(rc, 0, out)
        self.assertEqual(res["kernel"], "7.3.4-odpwatch")
        self.assertEqual((res["passed"], res["failed"], res["skipped"]), (4, 0, 2))
        self.assertEqual(out.splitlines()[-1], "4 passed, 0 failed, 2 skipped")

    def test_stock_comparison(self):
        # A test Debian's rdma-core passed must pass with ours; one it skipped
        # or failed is not compared.
        stock = ("test_a (tests.test_mr.M.test_a) ... ok\n"
                 "test_b (tests.test_mr.M.test_b) ... ok\n"
                 "test_c (tests.test_mr.M.test_c) ... skipped 'no'\nRan 3 tests in 0s\nOK\n")
        rc, out, res = self.run_main("odpwatch: kernel k\n", stock)
        self.assertEqual(rc, 1, out)
        vs = res["suites"]["rdma-core-vs-stock"]
        self.assertEqual((vs["passed"], vs["failed"], vs["skipped"]), (1, 1, 0))
        self.assertIn("passed with Debian's rdma-core, not run with ours", out)
        # No stock run at all is a failure, not a pass...
        rc, out, res = self.run_main("odpwatch: kernel k\n", "")
        self.assertEqual(rc, 1, out)
        # ...unless the guest said why it left it out.
        (Path(self.dir.name) / "rdma-core-stock.test_mr.log").unlink()
        self.write("rdma-core-stock.not-run", "debug kernel")
        rc, out, res = self.run_main("odpwatch: kernel k\n", None)
        self.assertEqual(rc, 0, out)
        self.assertNotIn("rdma-core-vs-stock", res["suites"])

    def test_main_splats_fail(self):
        for splat in ("[ 1.0] WARNING: CPU: 1 PID: 7 at mm/x.c:1 f+0x1/0x2",
                      "BUG: KASAN: slab-use-after-free in rxe_odp_foo",
                      "kmemleak: 2 new suspected memory leaks (see /sys/kernel/debug/kmemleak)",
                      "INFO: task kworker/0:1:12 blocked for more than 120 seconds.",
                      "rcu: INFO: rcu_preempt detected stalls on CPUs/tasks:",
                      "WARNING: possible circular locking dependency detected"):
            rc, out, res = self.run_main("odpwatch: kernel k\n" + splat + "\n")
            self.assertEqual(rc, 1, splat)
            self.assertEqual(res["console_splats"], 1, splat)


if __name__ == "__main__":
    unittest.main()
