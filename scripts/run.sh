#!/usr/bin/env bash
# The whole pipeline, stage by stage with durations:
#   run.sh check|check-series|demo|vm|bench|cluster [debug]
# host packages -> base kernel -> materialised tree -> kernel build -> guest
# root filesystem -> guest userspace (chroot) -> boot the job -> results.
. "$(dirname "$0")/lib.sh"

job=$1 variant=${2:-std}
# The debug guest (KASAN, lockdep under TCG) runs its suites in ~25 minutes
# beside the production lane (1469 s in the run at 1b0e1ef, docs/ci.md),
# depending on the host's load: give it more room than the default 1800 s.
[ "$variant" = debug ] && export TIMEOUT=${TIMEOUT:-3600}
# The process that started this run (make): run-vm.sh stops the guest when
# it is gone, so a killed make leaves no QEMU behind.
export ODPWATCH_LEADER=${ODPWATCH_LEADER:-$PPID}
t0=$(date +%s)
rc=0
# The ledger of stages (lib.sh stage) belongs to the outermost run: make
# check's two kernels write one ledger, which check.sh prints at the end.
if [ -z "${ODPWATCH_LEDGER:-}" ]; then
	export ODPWATCH_LEDGER=$$
	: >"$OUT/.stages"
	rm -f "$OUT"/.stage-now.*
fi

# Stage budgets (seconds) on 2 cores, from the runs in docs/ci.md: a fresh
# cache for the builds, make check's two lanes side by side for the guests
# (each guest slower beside the other). A stage over its budget says so, and
# make check lists it at the end; .ci/run's hard limit is what fails a run.
declare -A budget=([host]=300 [materialise]=240 [kernel-std]=900 [kernel-debug]=1200
	[series]=150 [series-fixes]=1500 [lint]=120 [i386]=120 [rootfs]=300 [rdma-core]=360 [userspace]=300 [libfabric]=600
	[guest-check-std]=2200 [guest-check-debug]=1800 [cluster]=600 [middleware]=1500 [kernel-ulps]=600 [rdma-fixes]=240
	[upstream-vs-vanilla]=600
	[bench-wire]=2400)
budgeted() { STAGE_BUDGET=${budget[$1]:-} stage "${@:2}"; }
# A stage on the two-guest cluster, in $OUT/$dir/SUB: node 0 runs CMD0, node 1 CMD1.
#   two_guests BUDGET-KEY DESCRIPTION SUB CMD0 CMD1
two_guests() {
	mkdir -p "$OUT/$dir/$3/node0" "$OUT/$dir/$3/node1"
	printf '%s\n' "$4" >"$OUT/$dir/$3/node0/cmd.sh"
	printf '%s\n' "$5" >"$OUT/$dir/$3/node1/cmd.sh"
	budgeted "$1" "$2" "$TOP/scripts/run-cluster.sh" "$dir/$3" "$kernel" "$rootfs"
}

# This run's results only: the job directory starts empty, so a file left
# by an earlier run can never be read as this one's.
dir=$job
[ "$variant" = std ] || dir=$job-$variant
remove_tree "$OUT/$dir"
mkdir -p "$OUT/$dir"

if [ "$job" = bench ]; then
	# The commit measured, as it is before anything is built (hash, clean
	# or dirty, subject): the report is written hours later, and HEAD may
	# have moved on by then.
	{
		git -C "$TOP" rev-parse --short=12 HEAD
		[ -z "$(git -C "$TOP" status --porcelain --untracked-files=no)" ] && echo clean || echo dirty
		git -C "$TOP" log -1 --format=%s
	} >"$OUT/$dir/commit"
fi
# make check's debug lane (ODPWATCH_REUSE=1, set by check.sh) starts once
# the production lane has built everything but the debug kernel, and boots
# beside that lane's guests: it reuses the tree, root filesystem and guest
# userspace, which the production lane's stages made and logged.
reuse=${ODPWATCH_REUSE:-0}
if [ "$job" = check ] && [ "$reuse" = 0 ]; then
	stage "harness self-test" python3 -m unittest discover -s "$TOP/scripts/tests" -q || rc=1
fi
if [ "$reuse" = 0 ]; then
	budgeted host "host packages" "$TOP/scripts/install-host-deps.sh" "$job"
	budgeted materialise "materialise kernel tree" "$TOP/scripts/materialise.sh" >"$OUT/.tree"
fi
tree=$(cat "$OUT/.tree")
build=$(dirname "$tree")/build-$variant
# make check builds the debug kernel while the production kernel's run goes
# on (ODPWATCH_BACKGROUND_KERNEL=debug, set by check.sh), at idle priority
# while this lane's kernel builds, at normal priority after: the debug
# kernel and its guest are the longest path of a run from an empty cache,
# the production lane's stages and guests are not.
if [ -n "${ODPWATCH_BACKGROUND_KERNEL:-}" ] && [ "$ODPWATCH_BACKGROUND_KERNEL" != "$variant" ]; then
	background_kernel "$tree" "$ODPWATCH_BACKGROUND_KERNEL"
fi
wait_background_kernel "$variant"
budgeted "kernel-$variant" "kernel build ($variant)" "$TOP/scripts/build-kernel.sh" "$tree" "$build" "$variant" >"$OUT/.bzimage-$variant"
kernel=$(cat "$OUT/.bzimage-$variant")
if [ -n "${ODPWATCH_BACKGROUND_KERNEL:-}" ] && [ "$ODPWATCH_BACKGROUND_KERNEL" != "$variant" ]; then
	promote_background_kernel "$ODPWATCH_BACKGROUND_KERNEL"
fi
if [ "$job" = check-series ]; then
	# Each series applies and yields this tree; the rdma fixes are built on
	# the vanilla base, whose kernel and the one with the fixes are booted below.
	budgeted series-fixes "series check, the rdma fixes on the vanilla base" "$TOP/scripts/check-series.sh" --fixes ||
		die "the series check failed"
fi
if [ "$reuse" = 0 ]; then
	budgeted rootfs "guest root filesystem" "$TOP/scripts/make-rootfs.sh" >"$OUT/.rootfs-stock"
	# The guest runs our rdma-core, installed over a copy of that rootfs.
	budgeted rdma-core "rdma-core (our series)" "$TOP/other-projects/rdma-core/build.sh" "$(cat "$OUT/.rootfs-stock")" >"$OUT/.rootfs"
fi
stock=$(cat "$OUT/.rootfs-stock")
rootfs=$(cat "$OUT/.rootfs")
if [ "$reuse" = 0 ]; then
	budgeted userspace "guest userspace (chroot)" "$TOP/scripts/build-guest.sh" "$rootfs" "$tree" "$build"
	[ "$job" = check-series ] ||
		budgeted libfabric "libfabric with the memwatch monitor (chroot)" "$TOP/other-projects/libfabric/build.sh" "$rootfs" "$tree" "$build"
	# What the debug lane waits for (check.sh): everything it reuses is built.
	echo "$build" >"$OUT/.userspace-ready.tmp" && mv "$OUT/.userspace-ready.tmp" "$OUT/.userspace-ready"
else
	# The userspace was built against the production kernel's uAPI headers;
	# the kernel's config does not change them, and this checks it.
	built=$(cat "$OUT/.userspace-ready")
	diff -rq "$built/usr/include" "$build/usr/include" >&2 ||
		die "the $variant kernel's uAPI headers differ from those the guest userspace was built with ($built)"
	log "guest userspace: the production lane's, built with the same uAPI headers"
fi

if [ "$job" = check ]; then
	# What each kernel runs. The debug kernel (KASAN, lockdep, kmemleak, fault
	# injection; ~10x slower under TCG) runs what exercises our kernel code:
	# the kselftests, the kernel-bug reproducers, the reliability and
	# fault-injection suites. rdma-core's own suite, the comparison with
	# Debian's rdma-core and the userspace-only tests (CLI, man pages, the
	# cache library) run on the production kernel only.
	deselect=""
	case $variant in
	debug) suites="selftests pyverbs-tests"
		pyverbs="test_harness.py test_rxe_odp.py test_rxe_qp_events.py test_fault_injection.py test_teardown.py test_stress.py test_limits.py"
		# test_limits' workloads (the caches under memory limits, demand
		# paging beyond memory: 740 s of the debug guest's 2000 s beside
		# the production lane at d35cded) run on the production kernel;
		# here only what charges and limits our kernel objects. The word
		# pages' accounting too (the selftest covers their code here).
		deselect="test_limits.py::test_demand_paging_beyond_memory test_limits.py::test_odp_cache_gives_memory_back_and_pins_nothing test_limits.py::test_memwatch_cache_releases_what_is_freed test_limits.py::test_pin_forever_keeps_its_peak_and_stops_at_the_memlock_limit test_limits.py::test_removed_watches_leave_no_word_pages" ;;
	*) suites="selftests upstream-kselftests pyverbs-tests rdma-core rdma-core-vs-stock cluster middleware examples kernel-ulps" pyverbs="" ;;
	esac
	printf 'SUITES="%s"\nPYVERBS_TESTS="%s"\nPYVERBS_DESELECT="%s"\n' "$suites" "$pyverbs" "$deselect" >"$OUT/$dir/plan"
fi
if [ "$job" = vm ]; then
	cmd=${ODPWATCH_CMD:-${CMD:-}}
	[ -n "$cmd" ] || die "vm needs a command: make vm CMD='...'"
	printf '%s\n' "$cmd" >"$OUT/$dir/cmd.sh"
fi
if [ "$job" = cluster ]; then
	[ -n "${ODPWATCH_CMD_A:-}" ] && [ -n "${ODPWATCH_CMD_B:-}" ] ||
		die "cluster needs a command per node: make cluster CMD_A='...' CMD_B='...'"
	mkdir -p "$OUT/$dir/node0" "$OUT/$dir/node1"
	printf '%s\n' "$ODPWATCH_CMD_A" >"$OUT/$dir/node0/cmd.sh"
	printf '%s\n' "$ODPWATCH_CMD_B" >"$OUT/$dir/node1/cmd.sh"
fi
if [ "$job" = bench ]; then
	args="--reps ${REPS:-5}"
	case ${QUICK:-0} in 1 | yes | y) args="--quick --reps ${REPS:-3}" ;; esac
	echo "$args" >"$OUT/$dir/args"
	# The full run takes longer than the default deadline.
	export TIMEOUT=${TIMEOUT:-7200}
fi
vmrc=0
if [ "$job" = check-series ]; then
	# The rdma fixes series' tests on the vanilla base and on the base with
	# the fixes: they must fail on one and pass on the other.
	for kind in vanilla fixes; do
		mkdir -p "$OUT/$dir/rdma-fixes/$kind"
		printf '%s\n' "/odpwatch/scripts/guest/run-fix-tests.sh $kind /out/$dir/rdma-fixes/$kind" \
			>"$OUT/$dir/rdma-fixes/$kind/cmd.sh"
		budgeted rdma-fixes "rdma fixes: the fix_* tests on the $kind kernel" env TIMEOUT=600 \
			"$TOP/scripts/run-vm.sh" vm "$dir/rdma-fixes/$kind" "$OUT/rdma-fixes/$kind.bzImage" "$rootfs" || true
	done
	# The base's own kselftests (configs/upstream-kselftests.list) on the
	# vanilla base and on ours: a test that passes on vanilla must pass on ours.
	for kind in vanilla ours; do
		mkdir -p "$OUT/$dir/upstream-vs-vanilla/$kind"
		printf '%s\n' "/odpwatch/scripts/guest/run-upstream-kselftests.sh /odpwatch/configs/upstream-kselftests.list \
/out/$dir/upstream-vs-vanilla/$kind/upstream-kselftests.ktap" >"$OUT/$dir/upstream-vs-vanilla/$kind/cmd.sh"
		image=$kernel
		[ "$kind" = ours ] || image=$OUT/rdma-fixes/vanilla.bzImage
		budgeted upstream-vs-vanilla "the base's kselftests on the $kind kernel" env TIMEOUT=1500 \
			"$TOP/scripts/run-vm.sh" vm "$dir/upstream-vs-vanilla/$kind" "$image" "$rootfs" || true
	done
elif [ "$job" = cluster ]; then
	budgeted "cluster" "boot two guests on a wire, run a command on each" "$TOP/scripts/run-cluster.sh" "$dir" "$kernel" "$rootfs" || vmrc=$?
else
	# The production guest's check, beside the debug guest, was killed at
	# run-vm.sh's default 1800 s at d35cded, in rdma-core's suite (the
	# base's mm and rdma kselftests took 800 s, uffd-unit-tests 481 s of
	# it; pyverbs 640 s): about 2100 s in all. Its own deadline only: the
	# cluster stages keep theirs.
	guest_timeout=${TIMEOUT:-}
	[ "$variant" = std ] && [ "$job" = check ] && guest_timeout=${TIMEOUT:-2700}
	budgeted "guest-$job-$variant" "boot and run '$job' in the guest ($variant)" \
		env ${guest_timeout:+TIMEOUT=$guest_timeout} "$TOP/scripts/run-vm.sh" "$job" "$dir" "$kernel" "$rootfs" "$stock" || vmrc=$?
fi
[ $vmrc = 0 ] || rc=$vmrc
if [ "$job" = check ] && [ "$variant" = std ]; then
	# The cluster suite: node 0 runs the tests, node 1 the responder agent.
	two_guests cluster "cluster suite: two guests on a wire" cluster \
		"/odpwatch/scripts/guest/run-cluster-suite.sh /out/$dir/cluster/node0" \
		"cd /odpwatch/cluster-tests && python3 agent.py" || true
	# The middleware suite (Debian's MPI stack), then the examples suite
	# (others' example clients), on node 0 and node 1 (sshd): one boot.
	two_guests middleware "middleware and examples suites: Debian's MPI and example clients across two guests" middleware \
		"/odpwatch/scripts/guest/run-middleware-suite.sh /out/$dir/middleware/node0" \
		"/odpwatch/scripts/guest/wait-for-file.sh /out/$dir/middleware/node0/middleware.status" || true
	# The kernel's own RDMA users (NVMe over fabrics, NFS), node 1 driven
	# over ssh. nvmet_rdma's use_srq is read at boot only: node 1's target
	# runs without an SRQ, node 0's with one.
	ODPWATCH_APPEND_NODE0="nvmet_rdma.use_srq=1" ODPWATCH_APPEND_NODE1="nvmet_rdma.use_srq=0" \
		two_guests kernel-ulps "kernel-ulps suite: NVMe over fabrics and NFS over rxe across two guests" kernel-ulps \
		"/odpwatch/scripts/guest/run-kernel-ulps-suite.sh /out/$dir/kernel-ulps/node0" \
		"/odpwatch/scripts/guest/wait-for-file.sh /out/$dir/kernel-ulps/node0/kernel-ulps.status" || true
	# The series a reviewer gets must apply, yield this tree, build and pass
	# lint; memwatch must build on 32-bit architectures too. No guest needs
	# them: they run last, on the core the debug guest leaves, and off the
	# path to the debug lane's start.
	budgeted series "series check" "$TOP/scripts/check-series.sh" || rc=1
	budgeted lint "lint" "$TOP/scripts/lint.sh" || rc=1
	budgeted i386 "i386 objects" "$TOP/scripts/build-32bit.sh" "$tree" "$(dirname "$tree")/build-i386" || rc=1
fi
if [ "$job" = bench ]; then
	# perftest across the wire (node 0 measures, node 1 serves the same
	# runs), NetPIPE over Open MPI launched from node 0 (node 1 runs only
	# sshd meanwhile), then UCX (node 1 serves). UCX runs last: its wire
	# runs hung in earlier runs (the client silent for 600 s; the full run
	# of 5ae2965 ran all 60), and a failure there must not take the MPI
	# rows with it.
	b=/out/guest/bin/odpwatch
	two_guests bench-wire "bench: perftest, MPI and UCX across two guests on a wire" cluster \
		"$b bench wire --peer \$ODPWATCH_PEER $args --csv /out/$dir/wire.csv >/out/$dir/wire.md 2>/out/$dir/wire.log; w=\$?
		$b bench mpi --peer \$ODPWATCH_PEER $args --csv /out/$dir/mpi.csv >/out/$dir/mpi.md 2>/out/$dir/mpi.log; m=\$?
		touch /out/$dir/mpi.done
		$b bench ucx --peer \$ODPWATCH_PEER $args --csv /out/$dir/ucx-wire.csv >/out/$dir/ucx-wire.md 2>/out/$dir/ucx-wire.log; u=\$?
		[ \$w = 0 ] && [ \$u = 0 ] && [ \$m = 0 ]" \
		"$b bench wire --serve $args 2>/out/$dir/wire-serve.log; w=\$?
		/odpwatch/scripts/guest/wait-for-file.sh /out/$dir/mpi.done
		$b bench ucx --serve $args 2>/out/$dir/ucx-wire-serve.log; u=\$?
		[ \$w = 0 ] && [ \$u = 0 ]" || rc=1
fi
case $job in
check)
	skips=(--expected-skips "$TOP/configs/expected-skips/$variant.txt")
	# The upstream mm kselftests' own skips (std only), in a list of their own.
	upstream_skips=$TOP/configs/expected-skips/$variant-upstream-kselftests.txt
	[ ! -f "$upstream_skips" ] || skips+=(--expected-skips "$upstream_skips")
	stage "results" python3 "$TOP/scripts/collect-results.py" "$OUT/$dir" \
		--suites "${suites// /,}" "${skips[@]}" --stock-floor "$TOP/configs/rdma-core-stock-floor.txt" || rc=1
	log "results: $OUT/$dir/results.json"
	;;
check-series)
	stage "results" python3 "$TOP/scripts/collect-results.py" "$OUT/$dir" --suites rdma-fixes,upstream-vs-vanilla \
		--vanilla-floor "$(grep -v '^#' "$TOP/configs/upstream-kselftests-vanilla-floor.txt")" || rc=1
	log "results: $OUT/$dir/results.json"
	;;
demo) echo; cat "$OUT/$dir/output" 2>/dev/null ;;
bench)
	# Debian's python3, the one python3-matplotlib is installed for.
	stage "report" /usr/bin/python3 "$TOP/scripts/bench-report.py" "$OUT/$dir" || rc=1
	log "bench: report in $OUT/$dir/report.md"
	;;
vm) log "vm: output of the command:"; cat "$OUT/$dir/output" 2>/dev/null; log "vm: exit status $rc" ;;
cluster)
	for n in 0 1; do log "cluster: node$n's output:"; cat "$OUT/$dir/node$n/output" 2>/dev/null; done
	log "cluster: exit status $rc"
	;;
esac
log "total: $(($(date +%s) - t0))s"
[ "$ODPWATCH_LEDGER" != $$ ] || stage_table
# The results' closing line stays last for check: print it again after the timings.
case $job in check | check-series) [ -f "$OUT/$dir/results.json" ] ;; *) false ;; esac &&
	python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("%(passed)d passed, %(failed)d failed, %(skipped)d skipped" % r)' "$OUT/$dir/results.json"
exit $rc
