#!/usr/bin/env bash
# make check: every suite on both kernels, in two lanes side by side.
#   The production lane (run.sh check std) builds the tree, the production
#   kernel, the root filesystem and the guest userspace, then runs its guests;
#   the debug kernel builds meanwhile in the background at idle priority.
#   The debug lane (run.sh check debug, its lines prefixed "[debug]") starts
#   once the production lane's userspace is built, reuses all of it, and boots
#   the debug kernel beside the production lane's guests: a TCG guest keeps
#   about one of the two cores busy, so the two lanes' guests share the
#   machine instead of taking turns.
# One ledger of stages for both; the slowest and those over budget are
# listed at the end, then the closing line of each kernel's results.json.
#   check.sh
. "$(dirname "$0")/lib.sh"

export ODPWATCH_LEADER=${ODPWATCH_LEADER:-$PPID}
export ODPWATCH_LEDGER=$$
: >"$OUT/.stages"
rm -f "$OUT"/.stage-now.* "$OUT/.userspace-ready" "$OUT/check/results.json" "$OUT/check-debug/results.json"
spid="" dpid=""
stop_lanes() {
	for p in $spid $dpid; do kill_tree "$p"; done
	stop_background_kernel debug
}
trap 'stop_lanes; exit 130' INT
trap 'stop_lanes; exit 143' TERM HUP
trap 'stop_background_kernel debug' EXIT
t0=$(date +%s)

ODPWATCH_LANE=std ODPWATCH_BACKGROUND_KERNEL=debug "$TOP/scripts/run.sh" check std &
spid=$!
# The debug lane, once the production lane's userspace is ready, reusing it.
# If that lane ended without it (a failed build), the debug lane is not run:
# it would meet the same failure, after as long again.
(
	while [ ! -f "$OUT/.userspace-ready" ] && kill -0 "$spid" 2>/dev/null; do sleep 2; done
	if [ -f "$OUT/.userspace-ready" ]; then
		ODPWATCH_LANE=debug ODPWATCH_REUSE=1 "$TOP/scripts/run.sh" check debug
	else
		log "not run: the production lane ended before it had built the guest userspace"
		false
	fi 2>&1 | sed -u 's/^/[debug] /'
) &
dpid=$!
rc=0
wait "$spid" || rc=1
wait "$dpid" || rc=1
log "check: both kernels in $(($(date +%s) - t0))s"
stage_table
# The closing lines: each kernel's distinct tests, then both together.
python3 - "$OUT/check/results.json" "$OUT/check-debug/results.json" <<'PY' || rc=1
import json, sys
keys = ("passed", "failed", "skipped")
runs = []
for path, name in zip(sys.argv[1:], ("std", "debug")):
    try:
        runs.append((name, json.load(open(path))))
    except (OSError, ValueError) as e:
        print(f"{name}: no results ({e})")
        runs.append((name, {"passed": 0, "failed": 1, "skipped": 0}))
for name, r in runs:
    print(f"{name} kernel: " + ", ".join(f"{r[k]} {k}" for k in keys))
    # Named here too: the tail of a CI log is often all a reader gets.
    for suite, s in r.get("suites", {}).items():
        for t in s.get("tests", []):
            if t["outcome"] == "failed":
                print(f"  FAILED {suite}: {t['name']}: {t.get('reason', '')[:300]}")
    if r.get("console_splats"):
        print(f"  console: {r['console_splats']} splat line(s), see {name}'s results above")
print(", ".join(f"{sum(r[k] for _, r in runs)} {k}" for k in keys))
PY
exit $rc
