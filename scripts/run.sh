#!/usr/bin/env bash
# The whole pipeline, stage by stage with durations:
#   run.sh check|demo|vm|bench [debug]
# host packages -> base kernel -> materialised tree -> kernel build -> guest
# root filesystem -> guest userspace (chroot) -> boot the job -> results.
. "$(dirname "$0")/lib.sh"

job=$1 variant=${2:-std}
# The debug guest (KASAN, lockdep under TCG) runs the suites in ~1000-1300 s,
# depending on the host's load: give it more room than the default 1800 s.
[ "$variant" = debug ] && export TIMEOUT=${TIMEOUT:-3000}
t0=$(date +%s)
rc=0
if [ "$job" = check ]; then
	stage "harness self-test" python3 -m unittest discover -s "$TOP/scripts/tests" -q || rc=1
fi
stage "host packages" "$TOP/scripts/install-host-deps.sh" "$job"
stage "materialise kernel tree" "$TOP/scripts/materialise.sh" >"$OUT/.tree"
tree=$(cat "$OUT/.tree")
build=$(dirname "$tree")/build-$variant
stage "kernel build ($variant)" "$TOP/scripts/build-kernel.sh" "$tree" "$build" "$variant" >"$OUT/.bzimage"
if [ "$job" = check ] && [ "$variant" = std ]; then
	# The series a reviewer gets must apply, yield this tree, build and pass lint.
	"$TOP/scripts/check-series.sh" || rc=1
	stage "lint" "$TOP/scripts/lint.sh" || rc=1
fi
stage "guest root filesystem" "$TOP/scripts/make-rootfs.sh" >"$OUT/.rootfs-stock"
stock=$(cat "$OUT/.rootfs-stock")
# The guest runs our rdma-core, installed over a copy of that rootfs.
stage "rdma-core (our series)" "$TOP/scripts/build-rdma-core.sh" "$stock" >"$OUT/.rootfs"
rootfs=$(cat "$OUT/.rootfs")
stage "guest userspace (chroot)" "$TOP/scripts/build-guest.sh" "$rootfs" "$tree" "$build"

dir=$job
[ "$variant" = std ] || dir=$job-$variant
if [ "$job" = vm ]; then
	cmd=${ODPWATCH_CMD:-${CMD:-}}
	[ -n "$cmd" ] || die "vm needs a command: make vm CMD='...'"
	mkdir -p "$OUT/$dir" && printf '%s\n' "$cmd" >"$OUT/$dir/cmd.sh"
fi
if [ "$job" = bench ]; then
	# A fresh directory: the report must hold this run's numbers only.
	rm -rf "${OUT:?}/$dir" && mkdir -p "$OUT/$dir"
	args="--reps ${REPS:-5}"
	case ${QUICK:-0} in 1 | yes | y) args="--quick --reps ${REPS:-3}" ;; esac
	echo "$args" >"$OUT/$dir/args"
	# The full run takes longer than the default deadline.
	export TIMEOUT=${TIMEOUT:-7200}
fi
vmrc=0
stage "boot and run '$job' in the guest" "$TOP/scripts/run-vm.sh" "$job" "$dir" "$(cat "$OUT/.bzimage")" "$rootfs" "$stock" || vmrc=$?
[ $vmrc = 0 ] || rc=$vmrc
case $job in
check)
	stage "results" python3 "$TOP/scripts/collect-results.py" "$OUT/$dir" || rc=1
	log "results: $OUT/$dir/results.json"
	;;
demo) echo; cat "$OUT/$dir/output" 2>/dev/null ;;
bench)
	# Debian's python3, the one python3-matplotlib is installed for.
	stage "report" /usr/bin/python3 "$TOP/scripts/bench-report.py" "$OUT/$dir" || rc=1
	log "bench: report in $OUT/$dir/report.md"
	;;
vm) log "vm: output of the command:"; cat "$OUT/$dir/output" 2>/dev/null; log "vm: exit status $rc" ;;
esac
log "total: $(($(date +%s) - t0))s"
# The results' closing line stays last for check: print it again after the timings.
[ "$job" = check ] && [ -f "$OUT/$dir/results.json" ] &&
	python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("%(passed)d passed, %(failed)d failed, %(skipped)d skipped" % r)' "$OUT/$dir/results.json"
exit $rc
