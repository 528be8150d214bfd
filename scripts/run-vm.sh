#!/usr/bin/env bash
# Boot the built kernel under QEMU (TCG, 2 cpus, no NIC, 9p root) and run one
# guest job; the guest powers itself off when done. A guest still running at
# the deadline is killed with a message. The full console is always kept in
# $OUT/JOB/console.log.
#   run-vm.sh JOB DIR BZIMAGE ROOTFS [STOCK]    JOB: check, demo or vm; DIR under $OUT
# STOCK: a root filesystem with Debian's own rdma-core, shared read-only
# (tag stock) so the guest can run Debian's rdma-core tests beside ours.
# Env: TIMEOUT (seconds, default 1800), VM_MEM_MB (default 4096), VM_CPUS
# (default 2). With two or more CPUs the guest has two NUMA nodes, a CPU and
# half the memory each, so page migration and NUMA hinting can be tested.
. "$(dirname "$0")/lib.sh"

job=$1 dir=$OUT/$2 kernel=$3 rootfs=$4 stock=${5:-}
timeout=${TIMEOUT:-1800}
mkdir -p "$dir"
rm -f "$dir/status" "$dir/console.log" "$dir/output"
log=$dir/console.log
share() { echo "-fsdev local,id=$1,path=$2,security_model=passthrough$3 -device virtio-9p-pci,fsdev=$1,mount_tag=$1"; }
# no5lvl: 4-level paging. A debug CI boot once had KASAN call the 5-level
# direct map a wild access, from an interrupt taken inside identify_cpu();
# likely (not confirmed) the moment the boot CPU's LA57 bit is re-read.
cpus=${VM_CPUS:-2} mem=${VM_MEM_MB:-4096}
numa=""
if [ "$cpus" -ge 2 ]; then
	half=$((mem / 2))
	numa="-object memory-backend-ram,id=mem0,size=${half}M -numa node,nodeid=0,cpus=0,memdev=mem0"
	numa+=" -object memory-backend-ram,id=mem1,size=$((mem - half))M -numa node,nodeid=1,cpus=1-$((cpus - 1)),memdev=mem1"
fi
# The root (read-only, unchanged while a guest runs) is mounted with
# cache=loose: without a page cache every exec read its binary and libraries
# again from the host, ~4 s on the debug kernel (docs/ci.md).
# shellcheck disable=SC2046,SC2086
qemu-system-x86_64 -machine pc -accel tcg,thread=multi -cpu max -smp "$cpus" -m "${mem}M" $numa \
	-nic none -display none -no-reboot -monitor none \
	-serial "file:$log" -kernel "$kernel" \
	-append "console=ttyS0 no5lvl pci=noacpi root=rootfs rootfstype=9p rootflags=trans=virtio,version=9p2000.L,msize=512000,cache=loose ro init=/sbin/odpwatch-init panic=-1 odpwatch.job=$job odpwatch.dir=$2" \
	$(share rootfs "$rootfs" ,readonly=on) $(share odpwatch "$TOP" ,readonly=on) $(share out "$OUT" "") \
	$([ -z "$stock" ] || share stock "$stock" ,readonly=on) \
	</dev/null >"$dir/qemu.log" 2>&1 &
qpid=$!
tpid=""
# QEMU runs in the background, where SIGINT is ignored: whatever ends this
# script (Ctrl-C, kill, the end of the make that started it) ends QEMU too.
stop_qemu() {
	if kill -0 $qpid 2>/dev/null; then
		kill $qpid 2>/dev/null
		for _ in 1 2 3 4 5; do kill -0 $qpid 2>/dev/null || break; sleep 1; done
		kill -KILL $qpid 2>/dev/null || true
		log "vm: stopped QEMU (pid $qpid)"
	fi
	[ -z "$tpid" ] || kill $tpid 2>/dev/null || true
}
trap stop_qemu EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
t0=$(date +%s)
# Progress: the guest's own lines and anything that looks like a splat.
tail -n +1 -F --pid=$qpid "$log" 2>/dev/null | sed -u 's/\r$//' |
	grep --line-buffered -E '^(\[ *[0-9.]+\] )?(odpwatch:|kmemleak: [0-9]+ new suspected|BUG:|WARNING:|Oops|Kernel panic)' &
tpid=$!
# Tests finished so far, from the result files the guest writes through 9p.
tests_done() {
	local n=0 f
	for f in "$dir"/selftests.ktap; do [ -f "$f" ] && n=$((n + $(grep -cE '^# (ok|not ok) [0-9]+ ' "$f"))); done
	for f in "$dir"/pyverbs-tests.log; do [ -f "$f" ] && n=$((n + $(grep -cE ' (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)( |$)' "$f"))); done
	for f in "$dir"/rdma-core*.log; do
		[ -f "$f" ] && n=$((n + $(grep -cE '\.\.\. (ok|FAIL|ERROR|skipped|expected failure|unexpected success)' "$f")))
	done
	echo "$n"
}
# The process that started the whole run (make): if it is gone, so are we.
leader=${ODPWATCH_LEADER:-}
timed_out=0 last=$t0
while kill -0 $qpid 2>/dev/null; do
	now=$(date +%s)
	if [ $((now - t0)) -ge "$timeout" ]; then
		timed_out=1
		kill $qpid 2>/dev/null || true
		break
	fi
	if [ -n "$leader" ] && ! kill -0 "$leader" 2>/dev/null; then
		log "vm: the run's leader (pid $leader) is gone: stopping the guest"
		exit 130
	fi
	if [ $((now - last)) -ge "${PROGRESS_INTERVAL:-50}" ]; then
		last=$now
		log "vm: $job running $((now - t0))s of ${timeout}s, $(tests_done) tests done"
	fi
	sleep 1
done
wait $qpid 2>/dev/null || true
sleep 2 # let tail print the last lines
kill $tpid 2>/dev/null || true
wait $tpid 2>/dev/null || true
log "vm: $job ran $(($(date +%s) - t0))s; console log: $log"
if [ $timed_out = 1 ]; then
	log "vm: the guest did not power off within ${timeout}s: killed QEMU (pid $qpid). Last console lines:"
	tail -n 30 "$log" | tr -d '\r' >&2
	exit 124
fi
if [ ! -f "$dir/status" ]; then
	log "vm: the guest stopped without finishing its job (panic or early failure). Last console lines:"
	tail -n 30 "$log" | tr -d '\r' >&2
	cat "$dir/qemu.log" >&2
	exit 125
fi
exit "$(cat "$dir/status")"
