#!/bin/sh
# Run every benchmark inside the guest: `odpwatch bench memwatch|odp|cache|ucx`,
# each writing its markdown table (NAME.md), its rows (NAME.csv) and its
# progress (NAME.log) into DIR, the pin-forever workload for each cache
# policy (pin-forever-POLICY.txt) and demand paging beyond memory
# (beyond-memory.txt); the host turns them into report.md with plots.
#   run-bench.sh DIR     DIR/args: extra arguments for every benchmark
#                        (e.g. --quick --reps 3), written by the host
dir=$1
say() { echo "odpwatch: $*"; }
args=$(cat "$dir/args" 2>/dev/null)
rc=0
uname -r >"$dir/kernel"
# Let the boot's own work (udev, deferred initcalls) settle: the first rows
# measured are baselines.
sleep 10
for b in memwatch odp cache ucx; do
	say "bench $b: running (odpwatch bench $b $args)"
	t0=$(date +%s)
	# shellcheck disable=SC2086 # args are words by design
	if /out/guest/bin/odpwatch bench $b $args --csv "$dir/$b.csv" >"$dir/$b.md" 2>"$dir/$b.log"; then
		say "bench $b: done in $(($(date +%s) - t0)) s, $(($(wc -l <"$dir/$b.csv") - 1)) rows"
	else
		rc=1
		say "bench $b: FAILED after $(($(date +%s) - t0)) s; last lines of its log:"
		tail -n 5 "$dir/$b.log" | sed 's/^/odpwatch:   /'
	fi
done
# Pin-forever against the cache's policies, one process each (the report
# plots memory over the workload's phases).
for p in pin-forever memwatch explicit-odp implicit-odp; do
	say "pin-forever: $p"
	/out/guest/bin/odpwatch-limits pin-forever "$p" 160 >"$dir/pin-forever-$p.txt" 2>&1
	st=$?
	# 3: a registration failed, as pin-forever is expected to.
	if [ $st != 0 ] && [ $st != 3 ]; then
		rc=1
		say "pin-forever: $p FAILED (exit $st): $(tail -n 1 "$dir/pin-forever-$p.txt")"
	fi
done
# Demand paging beyond memory: the ODP transfer rate as the resident
# fraction shrinks (1, 1/2, 1/4), three runs each.
say "beyond memory: running"
if ! python3 /odpwatch/scripts/guest/bench-beyond-memory.py 3 >"$dir/beyond-memory.txt" 2>&1; then
	rc=1
	say "beyond memory: FAILED: $(tail -n 1 "$dir/beyond-memory.txt")"
fi
exit $rc
