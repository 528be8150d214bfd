#!/usr/bin/env python3
"""Turn the raw outputs of a guest check run into out/check/results.json.

Reads DIR/selftests.ktap (kselftest runner, nested KTAP), DIR/upstream-kselftests.ktap
(the base kernel's mm kselftests, the same format), DIR/pyverbs-tests.xml
(pytest JUnit XML), DIR/rdma-core.<module>.log (unittest -v output, our
rdma-core), DIR/rdma-core-stock.<module>.log (the same with Debian's, for the
regression comparison) and DIR/console.log (splats). Prints one line per suite and ends with
"N passed, N failed, N skipped". Exit status 0 only when every suite ran at
least one test, nothing failed and the console has no splat.

Every suite the guest was to run must leave its results: a missing or
unreadable result file, an exit status that disagrees with the results, or a
module that did not report is a failure of that suite, never a silent pass.
With --expected-skips FILE, a skip not on that list (test id and reason) is a
failure, and list entries that no longer skip are reported so the list shrinks.
"""
import argparse
import fnmatch
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SPLAT = re.compile(
    r"BUG: |WARNING: |KASAN: |UBSAN: |Oops|Kernel panic|general protection fault"
    r"|possible circular locking|possible recursive locking|inconsistent lock state"
    r"|suspicious RCU usage|INFO: task .* blocked for more than|rcu.*detected stalls"
    r"|kmemleak: \d+ new suspected memory leaks|unreferenced object 0x")


def suite(tests):
    count = lambda o: sum(1 for t in tests if t["outcome"] == o)
    return {"passed": count("passed"), "failed": count("failed"),
            "skipped": count("skipped"), "tests": tests}


def failed(name, reason):
    return {"name": name, "outcome": "failed", "reason": reason}


# The runner's verdict on a binary: "ok|not ok N selftests: DIR: LABEL [# SKIP ...]".
RUNNER_VERDICT = re.compile(r"^(not ok|ok) \d+ selftests: (\S+): (\S+)(?: # (\w+)(.*))?", re.M)


def parse_ktap(path):
    """Nested KTAP from run_kselftest.sh: '# ok N name' lines belong to the
    binary announced by '# selftests: target: binary'. The runner's plan
    ('1..N') must be met: a binary that never reported is a failure. So must
    each binary's own plan ('# 1..N'): a binary that planned more cases than
    it reported fails, as does one that says so itself ('Planned tests !=
    run tests', a Totals line with errors), one that bails out, or one that
    printed a red failure mark in its output (khugepaged reports a failed
    case as ok when a later check of the same case passes). A binary the
    runner ran again after a listed race ('#retry: ' lines, the failed
    attempts) is judged by its last attempt; its cases carry 'retried'."""
    tests, binary, plan, reported, retried = [], None, None, 0, []
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"^1\.\.(\d+)$", line)
        if m and plan is None:
            plan = int(m[1])
            continue
        m = re.match(r"^# selftests: (\S+): (\S+)", line)
        if m:
            binary, inner, names, own_plan, trouble = f"{m[1]}/{m[2]}", 0, set(), None, []
            retried = []
            continue
        if line.startswith("#retry: "):
            m = re.match(r"^#retry: (attempt \d+ of \d+ failed.*)", line)
            if m:
                retried.append(m[1])
            continue
        m = re.match(r"^# 1\.\.(\d+)", line)
        if m and binary and own_plan is None:
            own_plan = int(m[1])
            continue
        m = re.match(r"^# (not ok|ok) (\d+)(?: (?!# (?:SKIP|XFAIL|XPASS|error)\b)(.+?))?"
                     r"(?: ?# (SKIP|XFAIL|XPASS|error)\b ?(.*))?$", line)
        if m and binary:
            inner += 1
            outcome = ("skipped" if m[4] == "SKIP" else "failed" if m[4] == "error"
                       else "passed" if m[1] == "ok" or m[4] == "XFAIL" else "failed")
            # kselftest.h tests may print no description, or one twice:
            # the case number keeps them apart.
            name = m[3] or ""
            if not name or name in names:
                name = f"{name} [{m[2]}]".lstrip()
            names.add(name)
            tests.append({"name": f"{binary}:{name}", "outcome": outcome,
                          **({"reason": m[5]} if m[5] else {})})
            continue
        if binary and line.startswith("# ") and (
                "Bail out!" in line or "\x1b[31m" in line or "Planned tests != run tests" in line
                or re.search(r"Totals: .* error:[1-9]", line)):
            trouble.append(line[2:].replace("\x1b[31m", "").replace("\x1b[0m", "").strip())
            continue
        # The runner's own verdict on a binary: counts only if it printed no results
        # (crashed, timed out) or failed overall.
        m = RUNNER_VERDICT.match(line)
        if m:
            reported += 1
            name = f"{m[2]}/{m[3]}"
            own = [t for t in tests if t["name"].startswith(name + ":")]
            if m[1] == "not ok" and not any(t["outcome"] == "failed" for t in own):
                tests.append(failed(name, (m[4] or "") + (m[5] or "") or "binary failed"))
            elif m[1] == "ok" and m[4] == "SKIP" and not own:
                # A binary that skipped as a whole (e.g. no device): one skip.
                tests.append({"name": name, "outcome": "skipped",
                              "reason": (m[5] or "").strip() or "binary skipped"})
            if binary == name and own_plan is not None and inner < own_plan:
                tests.append(failed(f"{name}: plan", f"planned {own_plan} cases, reported {inner}"))
            if binary == name and trouble:
                tests.append(failed(f"{name}: output", "; ".join(trouble)[:300]))
            if binary == name and retried:
                for t in tests:
                    if t["name"] == name or t["name"].startswith(name + ":"):
                        t["retried"] = "; ".join(retried)
            binary = None
    if plan is None:
        tests.append(failed(f"{path.name}: plan", "no '1..N' plan: the runner did not start"))
    elif reported < plan:
        tests.append(failed(f"{path.name}: plan", f"the runner reported {reported} of {plan} "
                            "test binaries: killed or hung"))
    return tests


def read_status(path):
    """The exit status a guest step wrote next to its log, or None."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def parse_junit(path, status_path=None):
    """pytest's JUnit XML, checked against pytest's exit status."""
    if not path.exists():
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        return [failed(f"{path.name}: parse", f"unreadable JUnit XML: {e}")]
    tests = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        outcome, reason = "passed", None
        for child in case:
            # A failure wins over a skip in any order (pytest writes an
            # error of the teardown after the skip of the call).
            if child.tag in ("failure", "error"):
                outcome, reason = "failed", (child.get("message") or "")[:300]
            elif child.tag == "skipped" and outcome != "failed":
                outcome, reason = "skipped", child.get("message")
        tests.append({"name": name, "outcome": outcome, **({"reason": reason} if reason else {})})
    if status_path is not None:
        # pytest: 0 all passed, 1 some failed; anything else (interrupted,
        # internal error, no tests) is a failure the XML may not show.
        status = read_status(status_path)
        anyfail = any(t["outcome"] == "failed" for t in tests)
        if status is None:
            tests.append(failed(f"{path.name}: status", f"no exit status in {status_path.name}: "
                                "pytest was killed"))
        elif status not in (0, 1) or (status == 1) != anyfail:
            tests.append(failed(f"{path.name}: status", f"pytest exited {status}"))
    return tests


PYTEST_ENDED = re.compile(r"^(\S+::.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
PYTEST_STARTED = re.compile(r"^(\S+::\S.*?)\s*$")
STACK_FRAME = re.compile(r"^\[<[0-9a-f]+>\] ([^+\s]+)")


def unfinished_pytest(log_path, status_path, stuck_path):
    """Why a pytest run left no JUnit XML: the test it had started (pytest -v
    prints a test's id before it runs and its outcome after), how many ended
    before it, how pytest ended, and where each thread was if the guest's
    watchdog caught it (pyverbs-tests.stuck: a "thread ..." line, then its
    kernel stack)."""
    if not log_path.exists():
        return "the suite produced no test results (and no log)"
    ended, last = 0, None
    for line in log_path.read_text(errors="replace").splitlines():
        if PYTEST_ENDED.match(line):
            ended, last = ended + 1, None
        elif m := PYTEST_STARTED.match(line):
            last = m[1]
    why = f"the suite produced no test results; {ended} tests ended"
    if last:
        why += f", {last} did not"
    status = read_status(status_path)
    why += {None: "; pytest left no exit status (the guest was powered off or reached its deadline)",
            137: "; pytest was killed (SIGKILL, the guest's watchdog)"}.get(status, f"; pytest exited {status}")
    if stuck_path.exists():
        threads, frames = [], 0
        for ln in stuck_path.read_text(errors="replace").splitlines():
            if ln.startswith("thread "):
                threads.append(ln.rstrip(":").removeprefix("thread ").replace("State:\t", ""))
                frames = 0
            elif threads and frames < 3 and (m := STACK_FRAME.match(ln)):
                frames += 1
                threads[-1] += f" < {m[1]}" if frames > 1 else f": {m[1]}"
        why += "; its threads: " + " | ".join(threads)
    return why


UNITTEST_HEAD = re.compile(r"^(test\w*) \(([\w.]+)\)")
UNITTEST_RESULT = re.compile(
    r"\.\.\. (ok|FAIL|ERROR|skipped '?(.*?)'?|expected failure|unexpected success)$")


def parse_unittest(path):
    """unittest -v: 'test_x (mod.Class.test_x) ... ok'; a docstring line may sit
    between the head and its result. Cross-checked against 'Ran N tests'."""
    tests, pending = [], None
    text = path.read_text(errors="replace")
    for line in text.splitlines():
        m = UNITTEST_HEAD.match(line)
        if m:
            pending = m[2] if m[2].endswith(m[1]) else f"{m[2]}.{m[1]}"
        r = UNITTEST_RESULT.search(line)
        if r and pending:
            word = r[1]
            if word in ("ok", "expected failure"):
                outcome, reason = "passed", None
            elif word.startswith("skipped"):
                outcome, reason = "skipped", r[2]
            else:
                outcome, reason = "failed", word
            tests.append({"name": pending, "outcome": outcome, **({"reason": reason} if reason else {})})
            pending = None
    ran = re.search(r"^Ran (\d+) tests?", text, re.M)
    if not ran:
        tests.append({"name": f"{path.name}: run", "outcome": "failed",
                      "reason": "no 'Ran N tests' line: the module crashed or did not load"})
    elif int(ran[1]) != len(tests):
        tests.append({"name": f"{path.name}: parse", "outcome": "failed",
                      "reason": f"unittest ran {ran[1]} tests but {len(tests)} results were parsed"})
    status = read_status(path.with_suffix(".status"))
    if status is not None and status != 0 and not any(t["outcome"] == "failed" for t in tests):
        tests.append(failed(f"{path.name}: status", "timed out" if status == 124
                            else f"exited {status} with no failed test"))
    return tests


def parse_modules(d, prefix):
    """The rdma-core modules the guest planned (PREFIX.modules), each of which
    must have left a log; None when the guest planned none."""
    plan = d / f"{prefix}.modules"
    logs = {p.name[len(prefix) + 1:-4]: p for p in d.glob(f"{prefix}.*.log")}
    if not plan.exists():
        return ([t for _, p in sorted(logs.items()) for t in parse_unittest(p)] or None) if logs else None
    tests = []
    for mod in plan.read_text().split():
        if mod in logs:
            tests += parse_unittest(logs[mod])
        else:
            tests.append(failed(f"{prefix}.{mod}.log: run", "the module left no log: not run"))
    return tests


def read_expected_skips(path):
    """'test id | reason' per line (reason: an fnmatch pattern); # comments."""
    entries = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if " | " not in line:
            raise SystemExit(f"{path}:{n}: expected 'test id | reason'")
        name, reason = line.split(" | ", 1)
        entries[name.strip()] = reason.strip()
    return entries


def gate_skips(suites, expected):
    """Turn every skip not on the list (or skipped for another reason) into a
    failure; return how many, and the list entries whose test ran and did not
    skip."""
    seen, unexpected = {}, 0
    for tests in suites.values():
        for t in tests or []:
            seen[t["name"]] = t["outcome"]
            if t["outcome"] != "skipped":
                continue
            want = expected.get(t["name"])
            reason = t.get("reason") or ""
            if want is None or not fnmatch.fnmatchcase(reason, want):
                unexpected += 1
                t["outcome"] = "failed"
                t["reason"] = (f"skipped ({reason}), and not on the expected-skips list"
                               + ("" if want is None else f" with that reason (listed: {want})"))
    return (unexpected, sorted(n for n in expected if seen.get(n) in ("passed", "failed")),
            sorted(n for n in expected if n not in seen))


def distinct_totals(suites):
    """Each test counted once. The comparison with Debian's rdma-core checks
    tests the rdma-core suite already counts: a comparison adds nothing to
    the totals, except that a test it fails (passed with Debian's, not with
    ours) counts as failed."""
    outcome = {}
    for name, s in suites.items():
        for t in s["tests"]:
            if "compares" not in t:
                outcome[(name, t["name"])] = t["outcome"]
    for s in suites.values():
        for t in s["tests"]:
            if "compares" in t and t["outcome"] == "failed":
                outcome[("rdma-core", t["compares"])] = "failed"
    return {k: sum(1 for o in outcome.values() if o == k) for k in ("passed", "failed", "skipped")}


def compare_with_stock(ours, stock):
    """One test per rdma-core test that passed with Debian's own rdma-core:
    it passes when the test also passed with ours (our series must not break
    what worked). Tests that did not pass with Debian's are not compared."""
    mine = {t["name"]: t["outcome"] for t in ours}
    tests = []
    for t in stock:
        if t["outcome"] != "passed":
            continue
        got = mine.get(t["name"], "not run")
        tests.append({"name": f"{t['name']} (Debian: passed)", "compares": t["name"],
                      "outcome": "passed" if got == "passed" else "failed",
                      **({} if got == "passed" else {"reason": f"passed with Debian's rdma-core, {got} with ours"})})
    return tests


def stock_floor(stock, path):
    """Debian's rdma-core must pass at least the floor of each module
    (PATH: 'module count' per line, # comments): a stock run that degrades
    would otherwise shrink the comparison silently."""
    floor = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        if len(line) != 2 or not line[1].isdigit():
            raise SystemExit(f"{path}:{n}: expected 'module count'")
        floor[line[0]] = int(line[1])
    passed = {}
    for t in stock:
        if t["outcome"] == "passed" and t["name"].startswith("tests."):
            mod = t["name"].split(".")[1]
            passed[mod] = passed.get(mod, 0) + 1
    tests = []
    for mod, want in sorted(floor.items()):
        got = passed.get(mod, 0)
        print(f"rdma-core-vs-stock: Debian's rdma-core passed {got} of {mod} (floor {want})")
        if got < want:
            tests.append(failed(f"rdma-core-stock.{mod}: floor",
                                f"Debian's rdma-core passed {got} tests of {mod}, fewer than the floor of "
                                f"{want} ({Path(path).name}): the comparison shrank"))
    return tests


SUITES = ("selftests", "upstream-kselftests", "pyverbs-tests", "rdma-core", "rdma-core-vs-stock", "cluster", "middleware",
          "examples", "kernel-ulps", "rdma-fixes", "upstream-vs-vanilla")


def parse_cluster(d, name="cluster"):
    """A two-guest suite: node 0's pytest results (DIR/node0/NAME.xml), and
    node 1 (the agent, or sshd) must have finished with status 0 (the agent
    exits 1 if node 0 vanished). The examples suite shares the middleware
    suite's boot, and so its directory."""
    tests = parse_junit(d / "node0" / f"{name}.xml", d / "node0" / f"{name}.status")
    if tests is None:
        return None
    status = d / "node1" / "status"
    st = status.read_text().strip() if status.exists() else "none"
    if st != "0":
        tests.append(failed(f"{name}: node1", f"node 1 finished with status {st}"))
    return tests


def parse_fixes(d):
    """The fix_* kselftests booted on the vanilla base and on the base with
    the rdma fixes series (DIR/rdma-fixes/{vanilla,fixes}/): each must pass
    with the fixes and fail on vanilla at its bug-specific assertion (the
    REPRODUCED marker that assertion logs), else it reproduces nothing. Each
    kernel's plan (the cases the guest ran, from the binary's own list) must
    be met: a case that left no result on either kernel fails, so a vanilla
    kernel that dies half-way can never shorten the comparison."""
    runs, plans, reproduced = {}, {}, {}
    for kind in ("vanilla", "fixes"):
        tap, plan = d / kind / "fix.tap", d / kind / "plan"
        if not tap.exists():
            return [failed(f"rdma-fixes: {kind}", f"no {tap}: the {kind} kernel did not run the tests")]
        if not plan.exists():
            return [failed(f"rdma-fixes: {kind} plan", f"no {plan}: the {kind} guest wrote no plan")]
        plans[kind] = plan.read_text().split()
        text = tap.read_text(errors="replace")
        # A skip proves nothing either way: it fails the case on either kernel.
        runs[kind] = {name: "skip" if skip else res for res, name, skip in
                      re.findall(r"^(ok|not ok) \d+ \S+?\.(fix_\w+)( # SKIP)?", text, re.M)}
        # The bug-specific assertion of a case logs its marker when it
        # fails (TH_LOG: "# FILE:LINE:CASE:REPRODUCED: ..."): a failure
        # without it (setup, a missing device) reproduces nothing.
        reproduced[kind] = set(re.findall(r"^# [^:\n]+:\d+:(fix_\w+):REPRODUCED:", text, re.M))
    tests = []
    for name in plans["fixes"]:
        res = runs["fixes"].get(name)
        tests.append({"name": f"with the fixes: {name}", "outcome": "passed" if res == "ok" else "failed",
                      **({} if res == "ok" else {"reason": "fails with the fixes applied" if res
                                                 else "left no result with the fixes"})})
    for name in plans["vanilla"]:
        res = runs["vanilla"].get(name)
        ok = res == "not ok" and name in reproduced["vanilla"]
        tests.append({"name": f"on vanilla: {name} fails", "outcome": "passed" if ok else "failed",
                      **({} if ok else
                         {"reason": "passes on vanilla: it reproduces nothing" if res == "ok"
                          else "fails on vanilla without its REPRODUCED marker: not the bug"
                          if res == "not ok"
                          else "skipped on vanilla" if res else "left no result on vanilla"})})
    if not plans["fixes"] or not plans["vanilla"]:
        tests.append(failed("rdma-fixes: runs", "a kernel planned no fix_* test"))
    # Every case run with the fixes is planned on vanilla too, or its
    # absence there is declared with a reason (DIR/vanilla/not-run).
    declared = d / "vanilla" / "not-run"
    excused = {line.split(" ", 1)[0] for line in declared.read_text().splitlines()} if declared.exists() else set()
    for name in sorted(set(plans["fixes"]) - set(plans["vanilla"]) - excused):
        tests.append(failed(f"on vanilla: {name}", "run with the fixes, neither run nor excused on vanilla"))
    return tests


def parse_vs_vanilla(d, floor=None):
    """The base kernel's own kselftests (configs/upstream-kselftests.list)
    booted on the vanilla base and on ours (make check-series,
    DIR/upstream-vs-vanilla/{vanilla,ours}/): one test per case that passed
    on vanilla, and per binary the runner passed there (the rdma scripts
    print no cases), which must pass on ours too; trouble ours reports for
    a binary (a short plan, a red mark in its output) that vanilla's run of
    it did not; a runner that did not finish on either kernel; and fewer
    cases passed on vanilla than FLOOR (a vanilla run that degrades would
    shrink the comparison)."""
    runs, verdicts = {}, {}
    for kind in ("vanilla", "ours"):
        path = d / kind / "upstream-kselftests.ktap"
        t = parse_ktap(path)
        if t is None:
            return [failed(f"upstream-vs-vanilla: {kind}", f"no results: the {kind} kernel did not run them")]
        runs[kind] = t
        verdicts[kind] = {f"{m[2]}/{m[3]}": "skipped" if m[4] == "SKIP" else "passed" if m[1] == "ok" else "failed"
                          for m in RUNNER_VERDICT.finditer(path.read_text(errors="replace"))}
        count = suite(t)
        print(f"upstream-vs-vanilla: on {kind}: {count['passed']} passed, {count['failed']} failed, "
              f"{count['skipped']} skipped")
    # Some cases print what they measured in their name (pagemap_ioctl's
    # "Extra pages 53 (0.1%)"): a name ours does not have is matched with
    # its numbers masked; each of ours is used once.
    def key(name):
        return re.sub(r"\d+", "#", name)
    exact, masked = {}, {}
    for t in runs["ours"]:
        exact.setdefault(t["name"], []).append(t)
        masked.setdefault(key(t["name"]), []).append(t)

    def take(name):
        mine = exact.get(name) or masked.get(key(name), [])
        for t in mine:
            if not t.get("used") and t["outcome"] == "passed":
                t["used"] = True
                return "passed"
        return mine[0]["outcome"] if mine else "not run"

    def compared(name, got, what="vanilla: passed"):
        return {"name": f"{name} ({what})", "outcome": "passed" if got == "passed" else "failed",
                **({} if got == "passed" else {"reason": f"passed on vanilla, {got} on ours"})}

    tests = [compared(t["name"], take(t["name"])) for t in runs["vanilla"] if t["outcome"] == "passed"]
    for binary, v in sorted(verdicts["vanilla"].items()):
        if v == "passed":
            tests.append(compared(binary, verdicts["ours"].get(binary, "not run"), "the binary, vanilla: passed"))
    theirs = {t["name"] for t in runs["vanilla"]}
    tests += [dict(t, name=f"ours: {t['name']}") for t in runs["ours"] if t["outcome"] == "failed" and
              t["name"].endswith((": plan", ": output")) and t["name"] not in theirs]
    # A runner that did not finish, on either kernel, shortens the comparison.
    for kind, t in runs.items():
        tests += [dict(x, name=f"{kind}: {x['name']}") for x in t
                  if x["outcome"] == "failed" and x["name"].startswith("upstream-kselftests.ktap:")]
    if floor is not None:
        n = sum(1 for t in runs["vanilla"] if t["outcome"] == "passed")
        print(f"upstream-vs-vanilla: vanilla passed {n} cases (floor {floor})")
        if n < floor:
            tests.append(failed("upstream-vs-vanilla: vanilla floor",
                                f"vanilla passed {n} cases, fewer than the floor of {floor}: the comparison shrank"))
    return tests


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("dir")
    ap.add_argument("--expected-skips", action="append",
                    help="a list of expected skips of the variant (more than one: their union)")
    ap.add_argument("--suites", default=",".join(SUITES),
                    help="the suites this kernel variant runs, comma-separated; each must leave results")
    ap.add_argument("--stock-floor", help="per module, the fewest tests Debian's rdma-core must pass")
    ap.add_argument("--vanilla-floor", type=int,
                    help="the fewest kselftest cases the vanilla base must pass (upstream-vs-vanilla)")
    args = ap.parse_args()
    wanted = args.suites.split(",")
    unknown = set(wanted) - set(SUITES)
    if unknown:
        ap.error(f"unknown suites: {', '.join(sorted(unknown))}")
    d = Path(args.dir)
    results = {"suites": {}}
    console = (d / "console.log").read_text(errors="replace").replace("\r", "") \
        if (d / "console.log").exists() else ""
    # The two-guest suites' consoles are scanned for splats too.
    # So is the kernel with the rdma fixes (not vanilla's: its bugs may splat).
    for c in sorted(d.glob("cluster/node*/console.log")) + sorted(d.glob("middleware/node*/console.log")) + \
            sorted(d.glob("kernel-ulps/node*/console.log")) + sorted(d.glob("rdma-fixes/fixes/console.log")) + \
            sorted(d.glob("upstream-vs-vanilla/ours/console.log")):
        console += "\n" + c.read_text(errors="replace").replace("\r", "")
    m = re.search(r"odpwatch: kernel ([^\s,]+)", console)
    results["kernel"] = m[1] if m else None

    suites = {"selftests": parse_ktap(d / "selftests.ktap"),
              "upstream-kselftests": parse_ktap(d / "upstream-kselftests.ktap"),
              "pyverbs-tests": parse_junit(d / "pyverbs-tests.xml", d / "pyverbs-tests.status"),
              "rdma-core": parse_modules(d, "rdma-core"),
              "cluster": parse_cluster(d / "cluster"),
              "middleware": parse_cluster(d / "middleware", "middleware"),
              "examples": parse_cluster(d / "middleware", "examples"),
              "kernel-ulps": parse_cluster(d / "kernel-ulps", "kernel-ulps"),
              "rdma-fixes": parse_fixes(d / "rdma-fixes"),
              "upstream-vs-vanilla": parse_vs_vanilla(d / "upstream-vs-vanilla", args.vanilla_floor)}
    stock = parse_modules(d, "rdma-core-stock")
    # A stock module that did not run is a failure of the comparison.
    suites["rdma-core-vs-stock"] = compare_with_stock(suites["rdma-core"] or [], stock or []) + \
        [t for t in stock or [] if t["outcome"] == "failed" and t["name"].startswith("rdma-core-stock.")]
    if args.stock_floor and "rdma-core-vs-stock" in wanted:
        suites["rdma-core-vs-stock"] += stock_floor(stock or [], args.stock_floor)
    for name in SUITES:
        if name not in wanted:
            del suites[name]
            print(f"{name}: not run on this kernel variant")
    ok = True
    if args.expected_skips:
        expected = {}
        for path in args.expected_skips:
            expected.update(read_expected_skips(path))
        unexpected, stale, unknown = gate_skips(suites, expected)
    for name, tests in suites.items():
        if not tests:
            if name == "pyverbs-tests":
                why = unfinished_pytest(d / "pyverbs-tests.log", d / "pyverbs-tests.status",
                                        d / "pyverbs-tests.stuck")
            elif "pytest did not die" in console:
                why = "not run: the guest was powered off after pyverbs-tests hung (pyverbs-tests.stuck)"
            else:
                why = "the suite produced no test results"
            tests = [{"name": f"{name}: suite", "outcome": "failed", "reason": why}]
        s = results["suites"][name] = suite(tests)
        ok &= s["failed"] == 0
        print(f"{name}: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped")
        for t in tests:
            if t["outcome"] == "failed":
                print(f"  FAILED {t['name']}: {t.get('reason', '')}")
        for t in tests:
            if "retried" in t:
                print(f"  {t['outcome']} after a retry: {t['name']} ({t['retried']})")
    if "rdma-core" in results["suites"]:
        per_module = {}
        for t in results["suites"]["rdma-core"]["tests"]:
            mod = t["name"].split(".")[1] if t["name"].startswith("tests.") else "?"
            per_module.setdefault(mod, {"passed": 0, "failed": 0, "skipped": 0})[t["outcome"]] += 1
        results["suites"]["rdma-core"]["modules"] = per_module
        for mod, c in sorted(per_module.items()):
            print(f"  rdma-core {mod}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
        reasons = {}
        for t in results["suites"]["rdma-core"]["tests"]:
            if t["outcome"] == "skipped":
                reasons[t.get("reason", "?")] = reasons.get(t.get("reason", "?"), 0) + 1
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"    skipped {n:2d}: {reason}")

    lines = console.splitlines()
    splats = [i for i, l in enumerate(lines) if SPLAT.search(l)]
    results["console_splats"] = len(splats)
    if splats:
        ok = False
        print(f"console: {len(splats)} splat line(s); first excerpt:")
        first = splats[0]
        print("\n".join("  " + l for l in lines[max(0, first - 2):first + 25]))
    else:
        print("console: no splats")

    if args.expected_skips:
        listed = " + ".join(Path(p).name for p in args.expected_skips)
        results["unexpected_skips"] = unexpected
        results["expected_skips_no_longer_skipped"] = stale
        print(f"skips: {unexpected} not on {listed} (failed above)" if unexpected
              else f"skips: every skip is on {listed}")
        for n in stale:
            print(f"  no longer skips (remove it from {listed}): {n}")
        # An entry naming no test that ran: renamed, removed, or its suite
        # not run on this variant. Reported so the list shrinks.
        results["expected_skips_unknown"] = unknown
        for n in unknown:
            print(f"  no such test ran (remove it from {listed}): {n}")

    total = distinct_totals(results["suites"])
    results.update(total)
    (d / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
