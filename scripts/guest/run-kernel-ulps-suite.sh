#!/bin/sh
# Node 0 of the kernel-ulps suite: the tests of kernel-ulps/ (NVMe over
# fabrics and NFS over RDMA, node 1 driven over ssh), results as JUnit XML
# in DIR/kernel-ulps.xml and a table of what each case moved in
# DIR/kernel-ulps.tsv; DIR/kernel-ulps.status, written last, lets node 1
# (wait-for-file.sh) finish.
#   run-kernel-ulps-suite.sh DIR
dir=$1
say() { echo "odpwatch: $*" >/dev/console; }
say "suite kernel-ulps: running against $ODPWATCH_PEER"
cd /odpwatch/kernel-ulps || exit 1
export ODPWATCH_ULPS_TABLE=$dir/kernel-ulps.tsv
printf 'ulp\tcase\twhat\tunit\tvalue\n' >"$ODPWATCH_ULPS_TABLE"
python3 -m pytest -v -p no:cacheprovider -o console_output_style=classic --timeout=600 \
	--junitxml="$dir/kernel-ulps.xml" . >"$dir/kernel-ulps.log" 2>&1
rc=$?
say "suite kernel-ulps: $(tail -n 1 "$dir/kernel-ulps.log")"
echo "$rc" >"$dir/kernel-ulps.status"
exit $rc
