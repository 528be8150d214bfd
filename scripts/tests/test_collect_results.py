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
1..3
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
# selftests: memwatch: no_device
# TAP version 13
# 1..0 # SKIP no rxe device
ok 3 selftests: memwatch: no_device # SKIP
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
            "memwatch/no_device": "skipped",
        })

    def test_ktap_cases_without_or_with_a_repeated_description(self):
        # kselftest.h output (upstream's mm tests): "ok 2 # SKIP why" has no
        # description, and a description may come twice; the case number
        # names them apart.
        ktap = ("1..1\n# selftests: mm: split\n# ok 1 split a\n# ok 2 # SKIP no pagecache\n"
                "# ok 3 same\n# not ok 4 same\n# ok 5 x # XFAIL known\nok 1 selftests: mm: split\n")
        got = outcomes(cr.parse_ktap(self.write("s.ktap", ktap)))
        self.assertEqual(got, {"mm/split:split a": "passed", "mm/split:[2]": "skipped",
                               "mm/split:same": "passed", "mm/split:same [4]": "failed",
                               "mm/split:x": "passed"})

    def test_ktap_a_binary_that_exits_0_over_a_failure(self):
        # A case reported ok after a red "Fail" in its output (khugepaged),
        # a plan not met, a kselftest.h "error" result, a bail-out: each
        # fails, though every binary exited 0.
        ktap = ("1..3\n# selftests: mm: khugepaged\n# 1..1\n"
                "# Collapse in child \x1b[31mFail\x1b[0m\n# ok 1 collapse_fork\n"
                "ok 1 selftests: mm: khugepaged\n"
                "# selftests: mm: mkdirty\n# 1..3\n# ok 1 a\n# not ok 2 # error no memory\n"
                "ok 2 selftests: mm: mkdirty\n"
                "# selftests: mm: cow\n# 1..1\n# Bail out! Page 3 is corrupted\n# ok 1 c\n"
                "ok 3 selftests: mm: cow\n")
        got = outcomes(cr.parse_ktap(self.write("s.ktap", ktap)))
        self.assertEqual(got, {"mm/khugepaged:collapse_fork": "passed",
                               "mm/khugepaged: output": "failed",
                               "mm/mkdirty:a": "passed", "mm/mkdirty:[2]": "failed",
                               "mm/mkdirty: plan": "failed",
                               "mm/cow:c": "passed", "mm/cow: output": "failed"})

    def test_ktap_a_retried_binary_is_judged_by_its_last_attempt(self):
        # The failed attempts ('#retry: ' lines) neither pass nor fail a
        # case; the cases of the last attempt carry the retry. A binary's
        # own line "retry: ..." ('# retry: ') is output like any other.
        ktap = ("1..3\n# selftests: mm: ksm\n#retry: 1..1\n#retry: not ok 1 KSM unmerging\n"
                "#retry: \x1b[31mred\x1b[0m\n#retry: attempt 1 of 4 failed (exit=1)\n"
                "# 1..1\n# ok 1 KSM unmerging\nok 1 selftests: mm: ksm\n"
                "# selftests: mm: again\n#retry: not ok 1 a\n#retry: attempt 1 of 2 failed (exit=1)\n"
                "# 1..1\n# not ok 1 a\nnot ok 2 selftests: mm: again # exit=1\n"
                "# selftests: mm: own\n# 1..1\n# retry: attempt 1 of 2 failed\n"
                "# retry: not ok 1 x\n# not ok 1 x\nnot ok 3 selftests: mm: own # exit=1\n")
        tests = cr.parse_ktap(self.write("s.ktap", ktap))
        self.assertEqual(outcomes(tests), {"mm/ksm:KSM unmerging": "passed", "mm/again:a": "failed",
                                           "mm/own:x": "failed"})
        self.assertEqual([t.get("retried") for t in tests],
                         ["attempt 1 of 4 failed (exit=1)", "attempt 1 of 2 failed (exit=1)", None])

    def test_ktap_runner_killed_before_plan_met(self):
        cut = KTAP[:KTAP.index("# selftests: memwatch")]
        got = outcomes(cr.parse_ktap(self.write("s.ktap", cut)))
        self.assertEqual(got["s.ktap: plan"], "failed")
        got = outcomes(cr.parse_ktap(self.write("s.ktap", "")))
        self.assertEqual(got, {"s.ktap: plan": "failed"})

    def test_junit_checked_against_pytest_status(self):
        xml = self.write("p.xml", JUNIT)
        for status, extra in (("1", None), ("0", "failed"), ("2", "failed"), (None, "failed"), ("x", "failed")):
            st = Path(self.dir.name) / "p.status"
            st.unlink(missing_ok=True)
            if status is not None:
                st.write_text(status + "\n")
            got = outcomes(cr.parse_junit(xml, st))
            self.assertEqual(got.get("p.xml: status"), extra, status)
        self.assertEqual(outcomes(cr.parse_junit(self.write("q.xml", "<testsuites><testsu"))),
                         {"q.xml: parse": "failed"})

    def test_module_status_and_plan(self):
        log = self.write("rdma-core.test_mr.log", "test_a (tests.test_mr.M.test_a) ... ok\nRan 1 test in 0s\nOK\n")
        self.write("rdma-core.test_mr.status", "124\n")
        self.assertEqual(outcomes(cr.parse_unittest(log))["rdma-core.test_mr.log: status"], "failed")
        self.write("rdma-core.test_mr.status", "0\n")
        self.write("rdma-core.modules", "test_mr test_odp\n")
        got = outcomes(cr.parse_modules(Path(self.dir.name), "rdma-core"))
        self.assertEqual(got, {"tests.test_mr.M.test_a": "passed", "rdma-core.test_odp.log: run": "failed"})
        # A log of a module this run did not plan (left by an earlier run) is not read.
        self.write("rdma-core.test_old.log", "test_z (tests.test_old.M.test_z) ... ok\nRan 1 test in 0s\nOK\n")
        got = outcomes(cr.parse_modules(Path(self.dir.name), "rdma-core"))
        self.assertNotIn("tests.test_old.M.test_z", got)

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

    A_REPRODUCED = "# rxe_odp_data.c:42:fix_a:REPRODUCED: the bytes moved are not the buffer's\n"

    def test_fixes(self):
        """A fix_* test must fail on vanilla and pass with the fixes; one
        that passes on vanilla reproduces nothing, a skip proves nothing."""
        def run(vanilla, fixes, plan="fix_a", vplan=None, excused=""):
            for kind, tap, p in (("vanilla", vanilla, plan if vplan is None else vplan), ("fixes", fixes, plan)):
                self.write(f"fx/{kind}/fix.tap", tap)
                self.write(f"fx/{kind}/plan", p)
            self.write("fx/vanilla/not-run", excused)
            return outcomes(cr.parse_fixes(Path(self.dir.name) / "fx"))
        (Path(self.dir.name) / "fx/vanilla").mkdir(parents=True)
        (Path(self.dir.name) / "fx/fixes").mkdir(parents=True)
        self.assertEqual(run(self.A_REPRODUCED + "not ok 1 odp.fix_a\n", "ok 1 odp.fix_a\n"),
                         {"on vanilla: fix_a fails": "passed", "with the fixes: fix_a": "passed"})
        # A failure elsewhere than at the bug's assertion (no marker, or
        # another case's) reproduces nothing.
        self.assertEqual(run("# x.c:9:fix_a:Expected 0 == ibv_reg_mr\nnot ok 1 odp.fix_a\n", "ok 1 odp.fix_a\n"),
                         {"on vanilla: fix_a fails": "failed", "with the fixes: fix_a": "passed"})
        self.assertEqual(run("# x.c:9:fix_ab:REPRODUCED: y\nnot ok 1 odp.fix_a\n", "ok 1 odp.fix_a\n"),
                         {"on vanilla: fix_a fails": "failed", "with the fixes: fix_a": "passed"})
        # Names with digits (fix_retry_count_7_...).
        self.assertEqual(run("# x.c:9:fix_a7_b:REPRODUCED: y\nnot ok 1 odp.fix_a7_b\n", "ok 1 odp.fix_a7_b\n",
                             plan="fix_a7_b"),
                         {"on vanilla: fix_a7_b fails": "passed", "with the fixes: fix_a7_b": "passed"})
        self.assertEqual(run("ok 1 odp.fix_a\n", "not ok 1 odp.fix_a\n"),
                         {"on vanilla: fix_a fails": "failed", "with the fixes: fix_a": "failed"})
        self.assertEqual(run("ok 1 odp.fix_a # SKIP x\n", "ok 1 odp.fix_a # SKIP x\n"),
                         {"on vanilla: fix_a fails": "failed", "with the fixes: fix_a": "failed"})
        self.assertIn("rdma-fixes: runs", run("", "ok 1 odp.fix_a\n", vplan=""))
        # A vanilla kernel that died after its first case: the second left no
        # result, and that fails (it used to be left out of the comparison).
        got = run("not ok 1 odp.fix_a\n", "ok 1 odp.fix_a\nok 2 odp.fix_b\n", plan="fix_a\nfix_b\n")
        self.assertEqual(got["on vanilla: fix_b fails"], "failed")
        # A case left out of vanilla's plan must be declared there.
        got = run("not ok 1 odp.fix_a\n", "ok 1 odp.fix_a\nok 2 odp.fix_b\n", plan="fix_a\nfix_b\n",
                  vplan="fix_a\n")
        self.assertEqual(got["on vanilla: fix_b"], "failed")
        got = run(self.A_REPRODUCED + "not ok 1 odp.fix_a\n", "ok 1 odp.fix_a\nok 2 odp.fix_b\n", plan="fix_a\nfix_b\n",
                  vplan="fix_a\n", excused="fix_b crashes vanilla\n")
        self.assertNotIn("on vanilla: fix_b", got)
        self.assertEqual(got["with the fixes: fix_b"], "passed")
        # No plan: the guest script did not get that far.
        (Path(self.dir.name) / "fx/vanilla/plan").unlink()
        self.assertEqual(outcomes(cr.parse_fixes(Path(self.dir.name) / "fx")),
                         {"rdma-fixes: vanilla plan": "failed"})

    def test_unfinished_pytest_names_the_test_and_where_its_threads_were(self):
        log = self.write("pyverbs-tests.log",
                         "test_a.py::test_one PASSED\ntest_a.py::test_two SKIPPED (x)\n"
                         "test_a.py::test_san[tsan-WARNING: ThreadSanitizer: data race] PASSED\n"
                         "test_b.py::test_hang \n")
        d = Path(self.dir.name)
        why = cr.unfinished_pytest(log, d / "pyverbs-tests.status", d / "pyverbs-tests.stuck")
        self.assertIn("3 tests ended, test_b.py::test_hang did not", why)
        self.assertIn("no exit status (the guest was powered off", why)
        self.assertNotIn("threads", why)
        self.write("pyverbs-tests.status", "137\n")
        self.write("pyverbs-tests.stuck",
                   "thread 90 (python3) State:\tD (disk sleep), wchan rxe_odp_wait:\n"
                   "[<0>] rxe_odp_wait+0x10/0x20\ncat: /proc/90/task/91/stack: No such file\n"
                   "[<0>] rxe_dereg+0x1/0x2\n[<0>] a+0x1/0x2\n"
                   "[<0>] b+0x1/0x2\nthread 91 (python3) State:\tS (sleeping), wchan 0:\n")
        why = cr.unfinished_pytest(log, d / "pyverbs-tests.status", d / "pyverbs-tests.stuck")
        self.assertIn("pytest was killed (SIGKILL", why)
        self.assertIn("its threads: 90 (python3) D (disk sleep), wchan rxe_odp_wait: "
                      "rxe_odp_wait < rxe_dereg < a | 91 (python3)", why)
        # A run whose last test ended is not blamed on it; one with a space
        # in its id is counted as ended.
        log.write_text("test_a.py::test_one PASSED\ntest_a.py::test_san[a b] FAILED\n")
        self.assertEqual(cr.unfinished_pytest(log, d / "none", d / "none"),
                         "the suite produced no test results; 2 tests ended; pytest left no exit "
                         "status (the guest was powered off or reached its deadline)")

    def test_junit(self):
        got = outcomes(cr.parse_junit(self.write("p.xml", JUNIT)))
        self.assertEqual(got, {"test_harness.test_ok": "passed", "test_harness.test_bad": "failed",
                               "test_harness.test_skip": "skipped"})

    def test_junit_a_failure_wins_over_a_skip(self):
        xml = self.write("s.xml", '<testsuites><testsuite name="pytest">'
                         '<testcase classname="t" name="a"><failure message="boom"/><skipped message="s"/></testcase>'
                         '<testcase classname="t" name="b"><skipped message="s"/><error message="teardown"/></testcase>'
                         '</testsuite></testsuites>')
        self.assertEqual(outcomes(cr.parse_junit(xml)), {"t.a": "failed", "t.b": "failed"})

    def run_main(self, console, stock="test_a (tests.test_mr.M.test_a) ... ok\nRan 1 test in 0s\nOK\n",
                 skips=None, suites=None, drop=None, node_console="", agent_status="0\n",
                 node_console_of="cluster", floor=None):
        d = Path(self.dir.name)
        # The two-guest suites: cluster (node 1 runs an agent), middleware
        # and kernel-ulps (node 1 runs sshd until node 0 is done).
        for name in ("cluster", "middleware", "kernel-ulps"):
            for n in (0, 1):
                (d / f"{name}/node{n}").mkdir(parents=True, exist_ok=True)
                self.write(f"{name}/node{n}/console.log",
                           node_console if n and name == node_console_of else "")
            self.write(f"{name}/node0/{name}.xml", '<testsuites><testsuite name="pytest">'
                       f'<testcase classname="test_{name}" name="test_write[odp]"/>'
                       '</testsuite></testsuites>')
            self.write(f"{name}/node0/{name}.status", "0\n")
            self.write(f"{name}/node1/status", "0\n")
        # The examples suite shares the middleware suite's boot and directory.
        self.write("middleware/node0/examples.xml", '<testsuites><testsuite name="pytest">'
                   '<testcase classname="test_examples" name="test_pingpong[rc]"/>'
                   '</testsuite></testsuites>')
        self.write("middleware/node0/examples.status", "0\n")
        if agent_status is None:
            (d / "cluster/node1/status").unlink(missing_ok=True)
        else:
            self.write("cluster/node1/status", agent_status)
        # The fix_* tests: failing on vanilla, passing with the fixes.
        for kind, res in (("vanilla", "not ok"), ("fixes", "ok")):
            (d / f"rdma-fixes/{kind}").mkdir(parents=True, exist_ok=True)
            marker = self.A_REPRODUCED if kind == "vanilla" else ""
            self.write(f"rdma-fixes/{kind}/fix.tap", f"TAP version 13\n1..1\n{marker}{res} 1 odp.fix_a\n")
            self.write(f"rdma-fixes/{kind}/plan", "fix_a\n")
        # The base's kselftests on vanilla and on ours (make check-series).
        for kind in ("vanilla", "ours"):
            (d / f"upstream-vs-vanilla/{kind}").mkdir(parents=True, exist_ok=True)
            self.write(f"upstream-vs-vanilla/{kind}/upstream-kselftests.ktap",
                       "1..1\n# selftests: mm: gup\n# 1..1\n# ok 1 D\nok 1 selftests: mm: gup\n")
        self.write("selftests.ktap", "1..1\n# selftests: a: b\n# ok 1 t\nok 1 selftests: a: b\n")
        self.write("upstream-kselftests.ktap",
                   "1..1\n# selftests: mm: cow\n# ok 1 COW\nok 1 selftests: mm: cow\n")
        self.write("pyverbs-tests.xml", JUNIT.replace("<failure", "<skipped").replace("</failure>", "</skipped>"))
        self.write("pyverbs-tests.status", "0\n")
        self.write("rdma-core.test_mr.log", "test_a (tests.test_mr.M.test_a) ... ok\nRan 1 test in 0s\nOK\n")
        if stock is not None:
            self.write("rdma-core-stock.test_mr.log", stock)
        self.write("console.log", console)
        if drop:
            (d / drop).unlink()
        argv = ["x", str(d)] + (["--suites", suites] if suites else [])
        if skips is not None:
            argv += ["--expected-skips", str(self.write("skips.txt", skips))]
        if floor is not None:
            argv += ["--stock-floor", str(self.write("floor.txt", floor))]
        out = io.StringIO()
        with redirect_stdout(out), unittest.mock.patch("sys.argv", argv):
            rc = cr.main()
        return rc, out.getvalue(), json.loads((d / "results.json").read_text())

    def test_skip_gate(self):
        listed = ("# comment\n"
                  "test_harness.test_skip | no device\n"
                  "test_harness.test_bad | assert *\n"
                  "test_harness.test_ok | gone\n")
        rc, out, res = self.run_main("odpwatch: kernel k\n", skips=listed)
        self.assertEqual(rc, 0, out)
        self.assertEqual(res["expected_skips_no_longer_skipped"], ["test_harness.test_ok"])
        self.assertIn("no longer skips (remove it from skips.txt): test_harness.test_ok", out)
        # An entry whose test does not exist (any more) is reported.
        rc, out, res = self.run_main("odpwatch: kernel k\n", skips=listed + "test_harness.test_gone | x\n")
        self.assertEqual(res["expected_skips_unknown"], ["test_harness.test_gone"])
        self.assertIn("no such test ran (remove it from skips.txt): test_harness.test_gone", out)
        # Not listed, or listed with another reason: the test fails.
        for listed in ("test_harness.test_skip | no device\n", "test_harness.test_skip | no device\n"
                       "test_harness.test_bad | something else\n"):
            rc, out, res = self.run_main("odpwatch: kernel k\n", skips=listed)
            self.assertEqual(rc, 1, out)
            self.assertEqual(res["unexpected_skips"], 1)
            self.assertEqual((res["passed"], res["failed"], res["skipped"]), (12, 1, 1))
            self.assertIn("not on the expected-skips list", out)

    def test_main_clean_console_passes(self):
        benign = ("odpwatch: kernel 7.3.4-odpwatch, 2 cpus\n"
                  "Kernel command line: console=ttyS0 panic=-1\n"
                  "kmemleak: Kernel memory leak detector initialized (mem pool available: 15000)\n")
        rc, out, res = self.run_main(benign)
        self.assertEqual(rc, 0, out)
        self.assertEqual(res["kernel"], "7.3.4-odpwatch")
        # Twelve distinct tests pass: the comparison with Debian's rdma-core
        # checks test_a of the rdma-core suite and is not counted again.
        self.assertEqual((res["passed"], res["failed"], res["skipped"]), (12, 0, 2))
        self.assertEqual(out.splitlines()[-1], "12 passed, 0 failed, 2 skipped")

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
        # In the totals test_b is one failed test (not run with ours), test_a
        # one passed test, counted once though two suites name it.
        self.assertEqual((res["passed"], res["failed"], res["skipped"]), (12, 1, 2))
        self.assertIn("passed with Debian's rdma-core, not run with ours", out)
        # No stock run at all is a failure, not a pass...
        rc, out, res = self.run_main("odpwatch: kernel k\n", "")
        self.assertEqual(rc, 1, out)
        # ...unless the variant does not run it.
        (Path(self.dir.name) / "rdma-core-stock.test_mr.log").unlink()
        rc, out, res = self.run_main("odpwatch: kernel k\n", None,
                                     suites="selftests,pyverbs-tests,rdma-core")
        self.assertEqual(rc, 0, out)
        self.assertNotIn("rdma-core-vs-stock", res["suites"])
        self.assertIn("rdma-core-vs-stock: not run on this kernel variant", out)

    def test_upstream_kselftests_against_vanilla(self):
        # A case that passed on vanilla must pass on ours, and so must a
        # binary the runner passed there (rdma's scripts print no cases);
        # what failed or skipped on vanilla is not compared; a runner that
        # did not finish on either kernel fails, as does a vanilla run
        # below its floor.
        d = Path(self.dir.name) / "upstream-vs-vanilla"
        run = ("1..3\n# selftests: mm: cow\n# 1..4\n# ok 1 A 0 extra\n# ok 2 B\n# not ok 3 C\n"
               "# ok 4 T 64 kB\nnot ok 1 selftests: mm: cow\n# selftests: mm: gup\n# 1..1\n# ok 1 D\n"
               "ok 2 selftests: mm: gup\n# selftests: rdma: rxe_ipv6.sh\nok 3 selftests: rdma: rxe_ipv6.sh\n")
        ours = (run.replace("# ok 2 B", "# not ok 2 B").replace("A 0 extra", "A 7 extra")
                .replace("ok 3 selftests: rdma", "not ok 3 selftests: rdma"))
        for kind, text in (("vanilla", run), ("ours", ours)):
            (d / kind).mkdir(parents=True, exist_ok=True)
            (d / kind / "upstream-kselftests.ktap").write_text(text)
        out = io.StringIO()
        with redirect_stdout(out):
            tests = cr.parse_vs_vanilla(d, floor=4)
        # (A names a number it measured: 0 on vanilla, 7 on ours.)
        self.assertEqual(outcomes(tests), {"mm/cow:A 0 extra (vanilla: passed)": "passed",
                                           "mm/cow:B (vanilla: passed)": "failed",
                                           "mm/cow:T 64 kB (vanilla: passed)": "passed",
                                           "mm/gup:D (vanilla: passed)": "passed",
                                           "mm/gup (the binary, vanilla: passed)": "passed",
                                           "rdma/rxe_ipv6.sh (the binary, vanilla: passed)": "failed"})
        self.assertIn("on vanilla: 4 passed, 1 failed, 0 skipped", out.getvalue())
        # Exact names first: a case of another size passing on ours does
        # not stand for this one, which fails there.
        text = run.replace("# ok 4 T 64 kB", "# ok 4 T 64 kB\n# not ok 5 T 2048 kB").replace("# 1..4", "# 1..5")
        (d / "vanilla" / "upstream-kselftests.ktap").write_text(text)
        (d / "ours" / "upstream-kselftests.ktap").write_text(
            text.replace("# ok 4 T 64 kB", "# not ok 4 T 64 kB").replace("# not ok 5 T 2048 kB", "# ok 5 T 2048 kB"))
        with redirect_stdout(io.StringIO()):
            got = outcomes(cr.parse_vs_vanilla(d))
        self.assertEqual(got["mm/cow:T 64 kB (vanilla: passed)"], "failed")
        # Ours stopped after the first binary; vanilla below its floor.
        (d / "vanilla" / "upstream-kselftests.ktap").write_text(run)
        (d / "ours" / "upstream-kselftests.ktap").write_text(run.split("# selftests: mm: gup")[0])
        with redirect_stdout(io.StringIO()):
            got = outcomes(cr.parse_vs_vanilla(d, floor=5))
        self.assertEqual(got["mm/gup:D (vanilla: passed)"], "failed")
        self.assertEqual(got["ours: upstream-kselftests.ktap: plan"], "failed")
        self.assertEqual(got["upstream-vs-vanilla: vanilla floor"], "failed")
        (d / "vanilla" / "upstream-kselftests.ktap").unlink()
        self.assertEqual(outcomes(cr.parse_vs_vanilla(d)), {"upstream-vs-vanilla: vanilla": "failed"})

    def test_stock_floor(self):
        # Debian's rdma-core passing fewer tests of a module than its floor
        # fails the comparison; at or above the floor it passes.
        rc, out, res = self.run_main("odpwatch: kernel k\n", floor="# c\ntest_mr 1\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("Debian's rdma-core passed 1 of test_mr (floor 1)", out)
        rc, out, res = self.run_main("odpwatch: kernel k\n", floor="test_mr 2\ntest_qp 1\n")
        self.assertEqual(rc, 1, out)
        vs = res["suites"]["rdma-core-vs-stock"]
        self.assertEqual((vs["passed"], vs["failed"]), (1, 2))
        self.assertIn("passed 1 tests of test_mr, fewer than the floor of 2", out)
        self.assertIn("passed 0 tests of test_qp, fewer than the floor of 1", out)
        # The real floor file parses, and a malformed one is refused.
        floor = Path(__file__).resolve().parents[2] / "configs/rdma-core-stock-floor.txt"
        self.assertEqual(cr.stock_floor([], floor)[0]["outcome"], "failed")
        with self.assertRaises(SystemExit):
            self.run_main("odpwatch: kernel k\n", floor="test_mr many\n")

    def test_a_stock_entry_can_be_one_test_class(self):
        # run-suites.sh runs only CQAPITest of Debian's test_cq: its log and
        # plan entry name the class, its tests count for test_cq's floor.
        d = Path(self.dir.name)
        self.write("rdma-core-stock.modules", "test_mr test_cq.CQAPITest\n")
        self.write("rdma-core-stock.test_cq.CQAPITest.log",
                   "test_c (tests.test_cq.CQAPITest.test_c) ... ok\nRan 1 test in 0s\nOK\n")
        rc, out, res = self.run_main("odpwatch: kernel k\n", floor="test_mr 1\ntest_cq 1\n")
        self.assertIn("Debian's rdma-core passed 1 of test_cq (floor 1)", out)
        # ...and the comparison holds ours to it: not run with ours fails.
        self.assertIn("passed with Debian's rdma-core, not run with ours", out)
        # A planned class that left no log fails.
        (d / "rdma-core-stock.test_cq.CQAPITest.log").unlink()
        rc, out, res = self.run_main("odpwatch: kernel k\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("rdma-core-stock.test_cq.CQAPITest.log: run", out)

    def test_a_wanted_suite_that_left_nothing_fails(self):
        for f in ("selftests.ktap", "pyverbs-tests.xml", "pyverbs-tests.status", "rdma-core.test_mr.log",
                  "cluster/node0/cluster.xml", "cluster/node0/cluster.status",
                  "middleware/node0/middleware.xml", "middleware/node0/middleware.status",
                  "kernel-ulps/node0/kernel-ulps.xml", "kernel-ulps/node0/kernel-ulps.status",
                  "rdma-fixes/vanilla/fix.tap", "rdma-fixes/fixes/fix.tap"):
            rc, out, res = self.run_main("odpwatch: kernel k\n", drop=f)
            self.assertEqual(rc, 1, f)

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

    def test_cluster_agent_and_node_consoles(self):
        # Node 1's agent must finish cleanly: it exits 1 when node 0 vanished.
        rc, out, res = self.run_main("odpwatch: kernel k\n", agent_status="1\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("node 1 finished with status 1", out)
        rc, out, res = self.run_main("odpwatch: kernel k\n", agent_status=None)
        self.assertEqual(rc, 1, out)
        # A splat on a node's console fails the run like one on the main guest's.
        for suite in ("cluster", "middleware", "kernel-ulps"):
            rc, out, res = self.run_main("odpwatch: kernel k\n", node_console="BUG: KASAN: x in y\n",
                                         node_console_of=suite)
            self.assertEqual(rc, 1, out)
            self.assertEqual(res["console_splats"], 1)


if __name__ == "__main__":
    unittest.main()
