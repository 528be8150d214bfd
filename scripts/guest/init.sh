#!/bin/sh
# The guest's init, run by /sbin/odpwatch-init with the repo mounted read-only
# at /odpwatch. Sets the guest up (mounts, huge pages, rxe on dummy0), runs the
# job named on the kernel command line (odpwatch.job=check|demo|vm|bench), then
# powers off, so QEMU (-no-reboot) exits in every case.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1

say() { echo "odpwatch: $*"; }
# reboot(RB_POWER_OFF) powers off inside the call (minbase has no poweroff
# binary, python3 is there). sysrq is the fallback; it is asynchronous, so
# wait with a builtin: once the 9p root is gone no program can be run.
poweroff_now() {
	sync
	python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0x4321FEDC)'
	echo o >/proc/sysrq-trigger
	while :; do :; done
}

mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm /dev/hugepages
# What udev would make: the kselftest runner writes to /dev/stdout.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t devpts devpts /dev/pts
for d in /tmp /run /var/tmp /var/lib /var/log /dev/shm; do mount -t tmpfs tmpfs "$d"; done
mount -t debugfs debugfs /sys/kernel/debug
mount -t hugetlbfs hugetlbfs /dev/hugepages || say "cannot mount hugetlbfs"
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /out; then
	say "cannot mount the output share (9p tag out)"
	poweroff_now
fi

# Debian's own rdma-core, when the host shares it, for the stock comparison.
[ -d /stock ] && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro stock /stock 2>/dev/null

job=$(sed -n 's/.*odpwatch\.job=\([a-z-]*\).*/\1/p' /proc/cmdline)
jobdir=/out/$(sed -n 's/.*odpwatch\.dir=\([a-z-]*\).*/\1/p' /proc/cmdline)
mkdir -p "$jobdir"
hostname odpwatch

# 2 MiB huge pages for the huge-page tests (hugetlbfs and IB_ACCESS_HUGETLB).
echo "${ODPWATCH_HUGEPAGES:-64}" >/proc/sys/vm/nr_hugepages
say "kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpus, $(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) MiB, $(cat /proc/sys/vm/nr_hugepages) huge pages"

# rxe on a dummy device; RDMA traffic never leaves the guest. The address is
# from the documentation range (RFC 5737): nothing routes it anywhere.
ip link set lo up
# The dummy driver, built in, already made dummy0 (numdummies=1).
ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
ip addr add 198.51.100.1/24 dev dummy0
ip link set dummy0 up
if rdma link add rxe0 type rxe netdev dummy0; then
	say "rxe0 up on dummy0"
else
	say "rdma link add rxe0 failed"
fi

rc=0
case $job in
check) /odpwatch/scripts/guest/run-suites.sh "$jobdir" || rc=$? ;;
demo) /out/guest/bin/odpwatch demo >"$jobdir/output" 2>&1 || rc=$? ;;
vm) (cd /odpwatch && sh "$jobdir/cmd.sh") >"$jobdir/output" 2>&1 || rc=$? ;;
bench) /odpwatch/scripts/guest/run-bench.sh "$jobdir" || rc=$? ;;
*) say "unknown job '$job'"; rc=2 ;;
esac

# A debug kernel: make kmemleak report now, in the console, where the splat
# scan reads it (it only prints on its own periodic scan otherwise).
if [ -w /sys/kernel/debug/kmemleak ]; then
	echo scan >/sys/kernel/debug/kmemleak
	sleep 6
	echo scan >/sys/kernel/debug/kmemleak
	leaks=$(grep -c '^unreferenced object' /sys/kernel/debug/kmemleak)
	if [ "$leaks" -gt 0 ]; then
		echo "kmemleak: $leaks new suspected memory leaks (odpwatch end-of-run scan)"
		cat /sys/kernel/debug/kmemleak
	else
		say "kmemleak: no leaks"
	fi
fi
dmesg >"$jobdir/dmesg.log"
echo "$rc" >"$jobdir/status"
say "job $job finished with status $rc, powering off"
poweroff_now
