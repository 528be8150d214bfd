#!/bin/sh
# Node 0 of the middleware and examples suites, one boot for both: the tests
# of middleware/tests/ (Debian's MPI stack across the two guests), then those
# of middleware/tests/examples/ (others' example clients, node 1 serving over
# ssh), results as JUnit XML in DIR/middleware.xml and DIR/examples.xml;
# DIR/middleware.status, written last, lets node 1 (wait-for-file.sh) finish.
#   run-middleware-suite.sh DIR
dir=$1
say() { echo "odpwatch: $*" >/dev/console; }
say "suite middleware: running against $ODPWATCH_PEER"
cd /odpwatch/middleware/tests || exit 1
# Each stale_send run adds a line: mpi, pml, registrations, way, size,
# messages, corrupt, how many frees the kernel declined (not_freed), how
# many new buffers landed at another address (elsewhere).
export ODPWATCH_MIDDLEWARE_MATRIX=$dir/matrix.tsv
printf 'mpi\tpml\tregistrations\tway\tsize\tmessages\tcorrupt\tnot_freed\telsewhere\n' >"$ODPWATCH_MIDDLEWARE_MATRIX"
python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic --timeout=600 \
	--ignore=examples --junitxml="$dir/middleware.xml" . >"$dir/middleware.log" 2>&1
rc=$?
say "suite middleware: $(tail -n 1 "$dir/middleware.log")"
say "suite examples: running against $ODPWATCH_PEER"
python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic --timeout=600 \
	--junitxml="$dir/examples.xml" examples >"$dir/examples.log" 2>&1
e=$?
echo "$e" >"$dir/examples.status"
say "suite examples: $(tail -n 1 "$dir/examples.log")"
# Each suite's status file holds its own pytest's status (collect-results.py
# checks it against that suite's XML); node 0's exit status is both.
echo "$rc" >"$dir/middleware.status"
[ "$e" = 0 ] || rc=$e
exit $rc
