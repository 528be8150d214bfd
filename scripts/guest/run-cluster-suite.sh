#!/bin/sh
# Node 0 of the cluster suite: the tests of cluster-tests/ against the agent
# on node 1, results as JUnit XML in DIR/cluster.xml (collect-results.py).
#   run-cluster-suite.sh DIR
dir=$1
say() { echo "odpwatch: $*" >/dev/console; }
say "suite cluster: running against $ODPWATCH_PEER"
cd /odpwatch/cluster-tests || exit 1
python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic --timeout=300 \
	--junitxml="$dir/cluster.xml" . >"$dir/cluster.log" 2>&1
rc=$?
echo "$rc" >"$dir/cluster.status"
say "suite cluster: $(tail -n 1 "$dir/cluster.log")"
exit $rc
