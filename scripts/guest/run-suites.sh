#!/bin/sh
# Run every test suite inside the guest. Raw outputs go to DIR (the host turns
# them into results.json); progress lines go to the console.
#   run-suites.sh DIR
# DIR/plan, written by the host (run.sh), says what this kernel variant runs:
# SUITES (of selftests upstream-kselftests pyverbs-tests rdma-core
# rdma-core-vs-stock) and
# PYVERBS_TESTS (files of pyverbs-tests/, empty for all) and PYVERBS_DESELECT
# (test ids of those files this variant leaves out).
dir=$1
say() { echo "odpwatch: $*"; }
SUITES="selftests pyverbs-tests rdma-core rdma-core-vs-stock" PYVERBS_TESTS="" PYVERBS_DESELECT=""
[ -f "$dir/plan" ] && . "$dir/plan"
runs() { case " $SUITES " in *" $1 "*) return 0 ;; esac; say "suite $1: not run on this kernel variant"; return 1; }
RDMA_DEV=${RDMA_DEV:-rxe0}
# rdma-core's suite, module by module (one process for all once crashed
# pyverbs on vanilla 7.3 after CQ errors): ours (our series over Debian's
# 56.1) with the modules the series adds, then Debian's own packages
# (/stock, chrooted) on the same kernel, for the regression comparison.
# Debian's test_cq.CQTest (test_resize_cq) races with rxe's completions and
# failed 6 of 20 stock runs: our rdma-core patch 0002 fixes the test, and
# the comparison takes only CQAPITest from Debian's (a test unit per entry).
RDMA_CORE_MODULES=${RDMA_CORE_MODULES:-test_odp test_mr test_qp test_cq test_shared_pd}
RDMA_CORE_STOCK_MODULES=${RDMA_CORE_STOCK_MODULES:-test_odp test_mr test_qp test_cq.CQAPITest}

# memwatch_scale adds 1M watches; on the debug kernel (KASAN, lockdep under
# TCG) a smaller count keeps the run inside its time, and so does a 32 MiB
# buffer for demand paging beyond memory (the same swap-out and fault-in
# paths; 64 MiB took 165 s a case there). Only a production kernel is held to
# the budget of 160 bytes of slab per watch (the word is apart; 155 measured).
case $(uname -r) in
*debug*)
	export MEMWATCH_SCALE_WATCHES=${MEMWATCH_SCALE_WATCHES:-65536}
	export ODPWATCH_BEYOND_MIB=${ODPWATCH_BEYOND_MIB:-32}
	;;
*) export MEMWATCH_SCALE_MAX_BYTES=${MEMWATCH_SCALE_MAX_BYTES:-160} ;;
esac
# A hang costs one test, not the run: pytest's per-test timeout
# (pytest-timeout), one per rdma-core module, the kselftest runner's own
# (selftests/*/settings).
PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-600}
MODULE_TIMEOUT=${MODULE_TIMEOUT:-900}

if ! runs selftests; then :
elif [ -x /out/guest/selftests/run_kselftest.sh ]; then
	say "suite selftests: running"
	# The runner reopens /dev/stdout for the tests' output: give it a pipe.
	# Ours: memwatch, and of upstream's rdma target the rxe ODP tests (its
	# shell tests are upstream-kselftests').
	ours="-c memwatch $(grep -o '^rdma:rxe_odp_[a-z_]*$' /out/guest/selftests/kselftest-list.txt | sed 's/^/-t /' | paste -sd' ')"
	# shellcheck disable=SC2086 # $ours is words
	(cd /out/guest/selftests && ./run_kselftest.sh $ours 2>&1 | cat) >"$dir/selftests.ktap"
	# None listed is a failure of the suite, not a shorter run.
	case $ours in *rdma:rxe_odp_*) ;; *)
		echo "not ok 0 selftests: rdma: rxe_odp_tests # not in kselftest-list.txt" >>"$dir/selftests.ktap" ;;
	esac
	say "suite selftests: $(grep -cE '^# ok [0-9]+ ' "$dir/selftests.ktap") ok, $(grep -cE '^# not ok [0-9]+ ' "$dir/selftests.ktap") not ok"
else
	say "suite selftests: not built (no /out/guest/selftests/run_kselftest.sh)"
fi

if runs upstream-kselftests; then
	if [ -d /out/guest/upstream-kselftests/mm ]; then
		say "suite upstream-kselftests: running the base kernel's mm kselftests"
		/odpwatch/scripts/guest/run-upstream-kselftests.sh /odpwatch/configs/upstream-kselftests.list \
			"$dir/upstream-kselftests.ktap"
	else
		say "suite upstream-kselftests: not built (no /out/guest/upstream-kselftests/mm)"
	fi
fi

if runs pyverbs-tests; then
	say "suite pyverbs-tests: running ${PYVERBS_TESTS:-every file}${PYVERBS_DESELECT:+, but $PYVERBS_DESELECT}"
	deselect=""
	for t in $PYVERBS_DESELECT; do deselect="$deselect --deselect $t"; done
	# shellcheck disable=SC2086 # lists of files and options by design
	(cd /odpwatch/pyverbs-tests && exec python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic \
		--timeout="$PYTEST_TIMEOUT" --junitxml="$dir/pyverbs-tests.xml" $deselect ${PYVERBS_TESTS:-.}) \
		>"$dir/pyverbs-tests.log" 2>&1 &
	pytest=$!
	# A test stuck where pytest's timeout cannot reach it (a thread in
	# the kernel) holds the suite until the guest's deadline: once its log
	# is quiet for the timeout and 300 s more, where each of pytest's
	# threads is goes to pyverbs-tests.stuck, and the blocked tasks to the
	# console (SysRq w). Then pytest is killed, and the suites after it
	# run; if it cannot die (a task looping in the kernel, as a QP's
	# destruction waiting for its task did), the guest is powered off:
	# its deadline would hold the run, and a looping task slows every
	# guest beside it.
	(
		while sleep 60 && kill -0 "$pytest" 2>/dev/null; do
			quiet=$(($(date +%s) - $(stat -c %Y "$dir/pyverbs-tests.log")))
			[ "$quiet" -gt $((PYTEST_TIMEOUT + 300)) ] || continue
			for t in /proc/"$pytest"/task/*; do
				echo "thread ${t##*/} ($(cat "$t/comm")) $(grep State: "$t/status"), wchan $(cat "$t/wchan"):"
				cat "$t/stack"
			done >"$dir/pyverbs-tests.stuck" 2>&1
			say "suite pyverbs-tests: no output for ${quiet}s; threads' stacks in pyverbs-tests.stuck; killing pytest"
			echo w >/proc/sysrq-trigger
			kill -9 "$pytest"
			# Its exit tears its verbs objects down: rxe may wait 50 s
			# for each.
			sleep 240
			if kill -0 "$pytest" 2>/dev/null; then
				say "suite pyverbs-tests: pytest did not die in 240 s (stuck in the kernel); powering the guest off"
				echo s >/proc/sysrq-trigger
				sleep 5
				echo o >/proc/sysrq-trigger
			fi
			break
		done
	) &
	watchdog=$!
	wait "$pytest"
	echo "$?" >"$dir/pyverbs-tests.status"
	kill "$watchdog" 2>/dev/null
	say "suite pyverbs-tests: $(tail -n 1 "$dir/pyverbs-tests.log")"
fi

if runs rdma-core; then
	say "suite rdma-core: running $RDMA_CORE_MODULES on $RDMA_DEV"
	rm -rf /tmp/rdma-core-tests
	cp -r /usr/share/doc/rdma-core/tests /tmp/rdma-core-tests
	# The plan: every module named here must leave its log.
	echo "$RDMA_CORE_MODULES" >"$dir/rdma-core.modules"
	for m in $RDMA_CORE_MODULES; do
		(cd /tmp/rdma-core-tests && timeout -k 10 "$MODULE_TIMEOUT" python3 run_tests.py --dev "$RDMA_DEV" -v "tests.$m") \
			>"$dir/rdma-core.$m.log" 2>&1
		echo "$?" >"$dir/rdma-core.$m.status"
		say "suite rdma-core: $m: $(grep -E '^(OK|FAILED)' "$dir/rdma-core.$m.log" | tail -n 1)"
	done
fi

if ! runs rdma-core-vs-stock; then :
elif [ -x /stock/usr/bin/python3 ]; then
	say "suite rdma-core-stock: Debian's rdma-core, $RDMA_CORE_STOCK_MODULES"
	for d in proc sys dev tmp; do
		case $d in tmp) mount -t tmpfs tmpfs /stock/tmp ;; *) mount --bind "/$d" "/stock/$d" ;; esac
	done
	# Debian compresses the suite's sources.
	chroot /stock sh -c 'cp -r /usr/share/doc/rdma-core/tests /tmp/tests && gunzip -f /tmp/tests/*.gz'
	echo "$RDMA_CORE_STOCK_MODULES" >"$dir/rdma-core-stock.modules"
	for m in $RDMA_CORE_STOCK_MODULES; do
		timeout -k 10 "$MODULE_TIMEOUT" chroot /stock env HOME=/tmp sh -c "cd /tmp/tests && python3 run_tests.py --dev $RDMA_DEV -v tests.$m" \
			>"$dir/rdma-core-stock.$m.log" 2>&1
		echo "$?" >"$dir/rdma-core-stock.$m.status"
		say "suite rdma-core-stock: $m: $(grep -E '^(OK|FAILED)' "$dir/rdma-core-stock.$m.log" | tail -n 1)"
	done
	for d in tmp dev sys proc; do umount "/stock/$d"; done
else
	say "suite rdma-core-stock: /stock (Debian's rdma-core) is not mounted"
fi
