#!/bin/sh
# The base kernel's mm and rdma kselftests (configs/upstream-kselftests.list),
# in the kselftest runner's nested KTAP, which collect-results.py reads as
# the upstream-kselftests suite: "1..N", then per entry "# selftests: DIR:
# LABEL", the binary's output with "# " before each line, and a verdict
# "ok|not ok I selftests: DIR: LABEL" (exit 4 is a skip, as the runner says
# it). DIR is mm unless the entry's label names it ("rdma/LABEL").
#   run-upstream-kselftests.sh LIST OUTPUT
list=$1 out=$2
say() { echo "odpwatch: $*"; }
# Seconds per binary, unless its entry names its own ("label 600: cmd"):
# a hung one must leave the later suites their time.
TIMEOUT=${UPSTREAM_KSELFTEST_TIMEOUT:-180}
# Several tests create files in their directory: a tmpfs copy (9p allows no
# shared writable mappings).
rm -rf /tmp/upstream-kselftests
cp -a /out/guest/upstream-kselftests /tmp/upstream-kselftests || exit 1
cd /tmp/upstream-kselftests || exit 1
# khugepaged's and cow's swap cases need swap: zram, off and reset after.
swap=no
if echo 256M >/sys/block/zram0/disksize; then
	if mkswap /dev/zram0 >/dev/null && swapon /dev/zram0; then
		swap=yes
	else
		echo 1 >/sys/block/zram0/reset
	fi
fi
[ $swap = yes ] || say "upstream kselftests: no zram swap; the swap cases will fail"
# The THP, KSM and hugetlb knobs, put back after each binary: the tests
# restore theirs only when they end normally (and ksm_functional_tests
# leaves use_zero_pages set). A bracketed choice is saved as the choice.
knobs=$(find /sys/kernel/mm/transparent_hugepage /sys/kernel/mm/ksm /sys/kernel/mm/hugepages \
	-type f -perm -u+w 2>/dev/null | sort)
snapshot() {
	# (shell built-ins only: a hundred forks cost seconds under TCG)
	# shellcheck disable=SC2086 # sysfs paths, no blanks
	for f in $knobs; do
		v=
		{ read -r v <"$f" || [ -n "$v" ]; } 2>/dev/null || continue
		case $v in *\[*\]*) v=${v#*\[} v=${v%%\]*} ;; esac
		printf '%s %s\n' "$f" "$v"
	done
}
restore() {
	snapshot >/tmp/upstream-kselftests.now
	cmp -s "$1" /tmp/upstream-kselftests.now && return
	while read -r f v; do
		echo "$v" >"$f" 2>/dev/null || true
	done <"$1"
}
snapshot >/tmp/upstream-kselftests.knobs

# The rdma tests make rxe devices of their own, on dummy and veth devices
# in network namespaces, and load the modules they use with modprobe. The
# guest's rxe0 goes first (and comes back after them); kmod learns the
# kernel's built-in modules, which a normal system lists in /lib/modules
# (the guest's read-only root has none), from a directory of its own.
rdma_ready=no
rdma_setup() {
	[ $rdma_ready = yes ] && return
	rdma_ready=yes
	v=$(uname -r) root=/tmp/kmod-root
	mkdir -p "$root/lib/modules/$v" /tmp/kmod-bin
	if ! cp /out/guest/kernel-modules/modules.builtin* "$root/lib/modules/$v/" ||
		! touch "$root/lib/modules/$v/modules.order" || ! depmod -b "$root" "$v"; then
		say "upstream kselftests: no modules.builtin for kmod; the rdma tests will skip"
	fi
	printf '#!/bin/sh\nexec /usr/sbin/modprobe -d %s "$@"\n' "$root" >/tmp/kmod-bin/modprobe
	printf '#!/bin/sh\nexec /usr/sbin/modinfo -b %s "$@"\n' "$root" >/tmp/kmod-bin/modinfo
	chmod +x /tmp/kmod-bin/modprobe /tmp/kmod-bin/modinfo
	PATH=/tmp/kmod-bin:$PATH
	rdma link del rxe0 2>/dev/null
}
rdma_restore() {
	[ $rdma_ready = yes ] || return 0
	# Back to shared: EBUSY until the tests' namespaces are gone, which
	# takes a while after "ip netns del" returns. The suites after this one
	# need rxe0 as init made it.
	n=0
	until rdma system show | grep -q 'netns shared' || rdma system set netns shared 2>/dev/null; do
		n=$((n + 1))
		[ $n -lt 60 ] || { say "upstream kselftests: the RDMA netns mode stays $(rdma system show)"; break; }
		sleep 1
	done
	rdma link show rxe0 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev dummy0 ||
		say "upstream kselftests: rxe0 did not come back on dummy0"
}

entries=$(grep -cv '^\(#\|$\)' "$list")
echo "TAP version 13" >"$out"
echo "1..$entries" >>"$out"
i=0
grep -v '^\(#\|$\)' "$list" >/tmp/upstream-kselftests.list
while IFS= read -r line; do
	i=$((i + 1))
	label=${line%%:*} cmd=${line#*: } limit=$TIMEOUT retries=0 khugepaged=
	case $label in *" "*)
		for word in ${label#* }; do
			case $word in
			retries=*) retries=${word#retries=} ;;
			khugepaged=idle) khugepaged=idle ;;
			*) limit=$word ;;
			esac
		done
		label=${label%% *}
		;;
	esac
	dir=mm
	case $label in */*) dir=${label%%/*} label=${label#*/} ;; esac
	[ "$dir" = rdma ] && rdma_setup
	echo "# selftests: $dir: $label" >>"$out"
	t0=$(date +%s) attempt=0
	while :; do
		attempt=$((attempt + 1))
		# khugepaged asleep for an hour (restore() wakes it after): it
		# would collapse what the binary just split before it looks.
		[ -z "$khugepaged" ] ||
			echo 3600000 >/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs
		# shellcheck disable=SC2086 # the command's words
		(cd "$dir" && exec timeout -k 10 "$limit" $cmd) </dev/null >/tmp/upstream-kselftest.out 2>&1
		rc=$?
		restore /tmp/upstream-kselftests.knobs
		# A listed race may fail an attempt (exit 1: not a crash, not a
		# timeout) while time is left: its output goes in as "#retry: "
		# lines (the "# " of a binary's own output cannot make them),
		# which collect-results.py reports but does not count, and the
		# binary runs again.
		if [ $rc != 1 ] || [ $attempt -gt "$retries" ] || [ $(($(date +%s) - t0)) -ge "$limit" ]; then
			break
		fi
		awk '{ print "#retry: " $0 }' /tmp/upstream-kselftest.out >>"$out"
		echo "#retry: attempt $attempt of $((retries + 1)) failed (exit=$rc)" >>"$out"
	done
	# (awk: a last line without a newline must not swallow the verdict)
	awk '{ print "# " $0 }' /tmp/upstream-kselftest.out >>"$out"
	echo "# $label took $(($(date +%s) - t0)) s" >>"$out"
	case $rc in
	0) echo "ok $i selftests: $dir: $label" >>"$out" ;;
	4) echo "ok $i selftests: $dir: $label # SKIP" >>"$out" ;;
	124 | 137) echo "not ok $i selftests: $dir: $label # TIMEOUT $limit seconds" >>"$out" ;;
	*) echo "not ok $i selftests: $dir: $label # exit=$rc" >>"$out" ;;
	esac
done </tmp/upstream-kselftests.list
rdma_restore

if [ $swap = yes ]; then
	if ! swapoff /dev/zram0 || ! echo 1 >/sys/block/zram0/reset; then
		say "upstream kselftests: zram0 not released"
	fi
fi
say "suite upstream-kselftests: $(grep -cE '^# ok [0-9]+ ' "$out") ok, $(grep -cE '^# not ok [0-9]+ ' "$out") not ok, $i of $entries binaries run"
