#!/bin/sh
# Run every test suite inside the guest. Raw outputs go to DIR (the host turns
# them into results.json); progress lines go to the console.
#   run-suites.sh DIR
dir=$1
say() { echo "odpwatch: $*"; }
RDMA_DEV=${RDMA_DEV:-rxe0}
# rdma-core's suite, module by module (one process for all once crashed
# pyverbs on vanilla 7.3 after CQ errors): ours (our series over Debian's
# 56.1) with the modules the series adds, then Debian's own packages
# (/stock, chrooted) on the same kernel, for the regression comparison.
RDMA_CORE_MODULES=${RDMA_CORE_MODULES:-test_odp test_mr test_qp test_cq test_memwatch test_shared_pd}
RDMA_CORE_STOCK_MODULES=${RDMA_CORE_STOCK_MODULES:-test_odp test_mr test_qp test_cq}

# memwatch_scale adds 1M watches; on the debug kernel (KASAN, lockdep under
# TCG) a smaller count keeps the run inside its time. Only a production kernel
# is held to the budget of 128 bytes of slab per watch (the word is apart).
case $(uname -r) in
*debug*) export MEMWATCH_SCALE_WATCHES=${MEMWATCH_SCALE_WATCHES:-65536} ;;
*) export MEMWATCH_SCALE_MAX_BYTES=${MEMWATCH_SCALE_MAX_BYTES:-128} ;;
esac
say "suite selftests: running"
if [ -x /out/guest/selftests/run_kselftest.sh ]; then
	# The runner reopens /dev/stdout for the tests' output: give it a pipe.
	(cd /out/guest/selftests && ./run_kselftest.sh 2>&1 | cat) >"$dir/selftests.ktap"
	say "suite selftests: $(grep -cE '^# ok [0-9]+ ' "$dir/selftests.ktap") ok, $(grep -cE '^# not ok [0-9]+ ' "$dir/selftests.ktap") not ok"
else
	say "suite selftests: not built (no /out/guest/selftests/run_kselftest.sh)"
fi

say "suite pyverbs-tests: running"
python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic \
	--junitxml="$dir/pyverbs-tests.xml" /odpwatch/pyverbs-tests >"$dir/pyverbs-tests.log" 2>&1
echo "$?" >"$dir/pyverbs-tests.status"
say "suite pyverbs-tests: $(tail -n 1 "$dir/pyverbs-tests.log")"

say "suite rdma-core: running $RDMA_CORE_MODULES on $RDMA_DEV"
rm -rf /tmp/rdma-core-tests
cp -r /usr/share/doc/rdma-core/tests /tmp/rdma-core-tests
for m in $RDMA_CORE_MODULES; do
	(cd /tmp/rdma-core-tests && python3 run_tests.py --dev "$RDMA_DEV" -v "tests.$m") \
		>"$dir/rdma-core.$m.log" 2>&1
	echo "$?" >"$dir/rdma-core.$m.status"
	say "suite rdma-core: $m: $(grep -E '^(OK|FAILED)' "$dir/rdma-core.$m.log" | tail -n 1)"
done

case $(uname -r) in
*debug*)
	# The comparison is of user space: the production kernel's run makes it
	# (on the debug kernel it doubled the rdma-core suite's time).
	echo "the debug kernel's run leaves the comparison to the production kernel's" \
		>"$dir/rdma-core-stock.not-run"
	say "suite rdma-core-stock: left to the production kernel's run" ;;
*)
if [ -x /stock/usr/bin/python3 ]; then
	say "suite rdma-core-stock: Debian's rdma-core, $RDMA_CORE_STOCK_MODULES"
	for d in proc sys dev tmp; do
		case $d in tmp) mount -t tmpfs tmpfs /stock/tmp ;; *) mount --bind "/$d" "/stock/$d" ;; esac
	done
	# Debian compresses the suite's sources.
	chroot /stock sh -c 'cp -r /usr/share/doc/rdma-core/tests /tmp/tests && gunzip -f /tmp/tests/*.gz'
	for m in $RDMA_CORE_STOCK_MODULES; do
		chroot /stock env HOME=/tmp sh -c "cd /tmp/tests && python3 run_tests.py --dev $RDMA_DEV -v tests.$m" \
			>"$dir/rdma-core-stock.$m.log" 2>&1
		say "suite rdma-core-stock: $m: $(grep -E '^(OK|FAILED)' "$dir/rdma-core-stock.$m.log" | tail -n 1)"
	done
	for d in tmp dev sys proc; do umount "/stock/$d"; done
else
	say "suite rdma-core-stock: /stock (Debian's rdma-core) is not mounted"
fi ;;
esac
