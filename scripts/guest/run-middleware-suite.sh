#!/bin/sh
# Node 0 of the middleware suite: the tests of middleware/tests/ (Debian's MPI
# stack across the two guests), results as JUnit XML in DIR/middleware.xml;
# DIR/middleware.status, written last, lets node 1 (wait-for-file.sh) finish.
#   run-middleware-suite.sh DIR
dir=$1
say() { echo "odpwatch: $*" >/dev/console; }
say "suite middleware: running against $ODPWATCH_PEER"
cd /odpwatch/middleware/tests || exit 1
# Each stale_send run adds a line: mpi, pml, registrations, way, size,
# messages, corrupt.
export ODPWATCH_MIDDLEWARE_MATRIX=$dir/matrix.tsv
printf 'mpi\tpml\tregistrations\tway\tsize\tmessages\tcorrupt\n' >"$ODPWATCH_MIDDLEWARE_MATRIX"
python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic --timeout=600 \
	--junitxml="$dir/middleware.xml" . >"$dir/middleware.log" 2>&1
rc=$?
say "suite middleware: $(tail -n 1 "$dir/middleware.log")"
echo "$rc" >"$dir/middleware.status"
exit $rc
