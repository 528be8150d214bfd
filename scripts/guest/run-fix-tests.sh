#!/bin/sh
# The fix_* cases of the rxe ODP kselftest (the bugs the rdma fixes series
# fixes) on the kernel this guest booted: the vanilla base or the base with
# the fixes. The verdict is collect-results.py's: each case must fail on
# vanilla and pass with the fixes.
#   run-fix-tests.sh vanilla|fixes OUTDIR
kind=$1 out=$2
bin=/out/guest/selftests/rdma/rxe_odp_data
mkdir -p "$out"
uname -r >"$out/kernel"
# The plan: every case run here must leave a result (collect-results.py);
# a case left out on vanilla is declared in not-run with its reason.
: >"$out/plan"
: >"$out/not-run"
set --
for t in $("$bin" -l 2>&1 | grep -o 'fix_[a-z0-9_]*'); do
	if [ "$kind" = vanilla ] && [ "$t" = fix_prefetch_of_a_pinned_mr_is_refused ]; then
		echo "$t on vanilla a prefetch of a pinned MR reads its umem as an ODP umem, past the allocation" >>"$out/not-run"
		continue
	fi
	echo "$t" >>"$out/plan"
	set -- "$@" -t "$t"
done
[ $# -gt 0 ] || { echo "no fix_* cases in $bin"; exit 1; }
"$bin" "$@" >"$out/fix.tap" 2>&1
echo "rxe_odp_data ${kind}: exit $?, $(grep -c '^ok ' "$out/fix.tap") ok, $(grep -c '^not ok ' "$out/fix.tap") not ok"
