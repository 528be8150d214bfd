#!/bin/sh
# The base kernel's mm kselftests (configs/upstream-kselftests.list), in the
# kselftest runner's nested KTAP, which collect-results.py reads as the
# upstream-kselftests suite: "1..N", then per entry "# selftests: mm: LABEL",
# the binary's output with "# " before each line, and a verdict "ok|not ok
# I selftests: mm: LABEL" (exit 4 is a skip, as the runner says it).
#   run-upstream-kselftests.sh LIST OUTPUT
list=$1 out=$2
say() { echo "odpwatch: $*"; }
TIMEOUT=${UPSTREAM_KSELFTEST_TIMEOUT:-300}
# Several tests create files in their directory: a tmpfs copy (9p allows no
# shared writable mappings).
rm -rf /tmp/upstream-kselftests
cp -a /out/guest/upstream-kselftests /tmp/upstream-kselftests || exit 1
cd /tmp/upstream-kselftests/mm || exit 1
# khugepaged's swap cases need swap: zram, off and reset again after.
swap=no
if echo 256M >/sys/block/zram0/disksize && mkswap /dev/zram0 >/dev/null && swapon /dev/zram0; then
	swap=yes
else
	say "upstream kselftests: no zram swap; khugepaged's swap cases will fail"
fi
# The tests save and restore THP and hugetlb knobs themselves, unless killed.
thp=/sys/kernel/mm/transparent_hugepage
saved_enabled=$(sed 's/.*\[\(.*\)\].*/\1/' $thp/enabled)
saved_defrag=$(sed 's/.*\[\(.*\)\].*/\1/' $thp/defrag)
saved_huge=$(cat /proc/sys/vm/nr_hugepages)

entries=$(grep -cv '^\(#\|$\)' "$list")
echo "TAP version 13" >"$out"
echo "1..$entries" >>"$out"
i=0
grep -v '^\(#\|$\)' "$list" >/tmp/upstream-kselftests.list
while IFS= read -r line; do
	i=$((i + 1))
	label=${line%%:*} cmd=${line#*: }
	echo "# selftests: mm: $label" >>"$out"
	# shellcheck disable=SC2086 # the command's words
	timeout -k 10 "$TIMEOUT" $cmd </dev/null >/tmp/upstream-kselftest.out 2>&1
	rc=$?
	sed 's/^/# /' /tmp/upstream-kselftest.out >>"$out"
	case $rc in
	0) echo "ok $i selftests: mm: $label" >>"$out" ;;
	4) echo "ok $i selftests: mm: $label # SKIP" >>"$out" ;;
	124 | 137) echo "not ok $i selftests: mm: $label # TIMEOUT $TIMEOUT seconds" >>"$out" ;;
	*) echo "not ok $i selftests: mm: $label # exit=$rc" >>"$out" ;;
	esac
done </tmp/upstream-kselftests.list

echo "$saved_enabled" >$thp/enabled
echo "$saved_defrag" >$thp/defrag
echo "$saved_huge" >/proc/sys/vm/nr_hugepages
if [ $swap = yes ]; then
	swapoff /dev/zram0
	echo 1 >/sys/block/zram0/reset
fi
say "suite upstream-kselftests: $(grep -cE '^# ok [0-9]+ ' "$out") ok, $(grep -cE '^# not ok [0-9]+ ' "$out") not ok, $i of $entries binaries run"
