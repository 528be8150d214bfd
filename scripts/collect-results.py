#!/usr/bin/env python3
"""Turn the raw outputs of a guest check run into out/check/results.json.

Reads DIR/selftests.ktap (kselftest runner, nested KTAP), DIR/pyverbs-tests.xml
(pytest JUnit XML), DIR/rdma-core.<module>.log (unittest -v output, our
rdma-core), DIR/rdma-core-stock.<module>.log (the same with Debian's, for the
regression comparison) and DIR/console.log (splats). Prints one line per suite and ends with
"N passed, N failed, N skipped". Exit status 0 only when every suite ran at
least one test, nothing failed and the console has no splat.
"""
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


def parse_ktap(path):
    """Nested KTAP from run_kselftest.sh: '# ok N name' lines belong to the
    binary announced by '# selftests: target: binary'."""
    tests, binary = [], None
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        m = re.match(r"^# selftests: (\S+): (\S+)", line)
        if m:
            binary, inner = f"{m[1]}/{m[2]}", 0
            continue
        m = re.match(r"^# (not ok|ok) \d+ (.+?)(?: # (SKIP|XFAIL)\b ?(.*))?$", line)
        if m and binary:
            inner += 1
            outcome = ("skipped" if m[3] == "SKIP" else "passed" if m[1] == "ok" or m[3] == "XFAIL"
                       else "failed")
            tests.append({"name": f"{binary}:{m[2]}", "outcome": outcome,
                          **({"reason": m[4]} if m[4] else {})})
            continue
        # The runner's own verdict on a binary: counts only if it printed no results
        # (crashed, timed out) or failed overall.
        m = re.match(r"^(not ok|ok) \d+ selftests: (\S+): (\S+)(?: # (\w+)(.*))?", line)
        if m:
            name = f"{m[2]}/{m[3]}"
            if m[1] == "not ok" and not any(t["name"].startswith(name + ":") and
                                            t["outcome"] == "failed" for t in tests):
                tests.append({"name": name, "outcome": "failed",
                              "reason": (m[4] or "") + (m[5] or "") or "binary failed"})
            binary = None
    return tests


def parse_junit(path):
    if not path.exists():
        return None
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        outcome, reason = "passed", None
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, reason = "failed", (child.get("message") or "")[:300]
            elif child.tag == "skipped":
                outcome, reason = "skipped", child.get("message")
        tests.append({"name": name, "outcome": outcome, **({"reason": reason} if reason else {})})
    return tests


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
    return tests


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
        tests.append({"name": f"{t['name']} (Debian: passed)",
                      "outcome": "passed" if got == "passed" else "failed",
                      **({} if got == "passed" else {"reason": f"passed with Debian's rdma-core, {got} with ours"})})
    return tests


def main():
    d = Path(sys.argv[1])
    results = {"suites": {}}
    console = (d / "console.log").read_text(errors="replace").replace("\r", "") \
        if (d / "console.log").exists() else ""
    m = re.search(r"odpwatch: kernel ([^\s,]+)", console)
    results["kernel"] = m[1] if m else None

    suites = {"selftests": parse_ktap(d / "selftests.ktap"),
              "pyverbs-tests": parse_junit(d / "pyverbs-tests.xml")}
    logs = sorted(d.glob("rdma-core.*.log"))
    suites["rdma-core"] = [t for p in logs for t in parse_unittest(p)] if logs else None
    stock_logs = sorted(d.glob("rdma-core-stock.*.log"))
    not_run = d / "rdma-core-stock.not-run"
    if not_run.exists() and not stock_logs:
        print(f"rdma-core-vs-stock: not run here: {not_run.read_text().strip()}")
    else:
        suites["rdma-core-vs-stock"] = compare_with_stock(
            suites["rdma-core"] or [], [t for p in stock_logs for t in parse_unittest(p)])
    ok = True
    for name, tests in suites.items():
        if not tests:
            tests = [{"name": f"{name}: suite", "outcome": "failed",
                      "reason": "the suite produced no test results"}]
        s = results["suites"][name] = suite(tests)
        ok &= s["failed"] == 0
        print(f"{name}: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped")
        for t in tests:
            if t["outcome"] == "failed":
                print(f"  FAILED {t['name']}: {t.get('reason', '')}")
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

    total = {k: sum(s[k] for s in results["suites"].values()) for k in ("passed", "failed", "skipped")}
    results.update(total)
    (d / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
