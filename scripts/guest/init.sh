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
[ -d /stock ] && mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro stock /stock 2>/dev/null

job=$(sed -n 's/.*odpwatch\.job=\([a-z-]*\).*/\1/p' /proc/cmdline)
jobdir=/out/$(sed -n 's/.*odpwatch\.dir=\([a-z0-9/-]*\).*/\1/p' /proc/cmdline)
# A node of the two-guest cluster (run-cluster.sh): 0 or 1.
node=$(sed -n 's/.*odpwatch\.node=\([01]\).*/\1/p' /proc/cmdline)
mkdir -p "$jobdir"
hostname "odpwatch${node:+-node$node}"

# 2 MiB huge pages for the huge-page tests (hugetlbfs and IB_ACCESS_HUGETLB).
echo "${ODPWATCH_HUGEPAGES:-64}" >/proc/sys/vm/nr_hugepages
say "kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) cpus, $(awk '/MemTotal/ { print int($2 / 1024) }' /proc/meminfo) MiB, $(cat /proc/sys/vm/nr_hugepages) huge pages"

# rxe on a dummy device; RDMA traffic never leaves the guest. The address is
# from the documentation range (RFC 5737): nothing routes it anywhere. A
# cluster node puts rxe on eth0 instead, the wire to the other node, with an
# address of the same range that exists only on that wire.
ip link set lo up
netdev=dummy0
if [ -n "$node" ]; then
	netdev=eth0
	ip link set eth0 mtu 9000 up
	ip addr add "198.51.100.$((10 + node))/24" dev eth0
	export ODPWATCH_NODE=$node ODPWATCH_SELF=198.51.100.$((10 + node)) ODPWATCH_PEER=198.51.100.$((11 - node))
	# Both nodes by name (MPI launchers want names), over the read-only
	# root's /etc/hosts; sshd for the launchers' remote daemons.
	printf '127.0.0.1 localhost\n198.51.100.10 odpwatch-node0\n198.51.100.11 odpwatch-node1\n' >/run/hosts
	mount --bind /run/hosts /etc/hosts
	if [ -x /usr/sbin/sshd ]; then
		mkdir -p /run/sshd
		/usr/sbin/sshd -o ListenAddress="$ODPWATCH_SELF" -E /run/sshd.log || say "sshd did not start"
	fi
else
	# The dummy driver, built in, already made dummy0 (numdummies=1).
	ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
	ip addr add 198.51.100.1/24 dev dummy0
	ip link set dummy0 up
fi
if rdma link add rxe0 type rxe netdev $netdev; then
	say "rxe0 up on $netdev"
else
	say "rdma link add rxe0 failed"
fi

rc=0
case $job in
check) /odpwatch/scripts/guest/run-suites.sh "$jobdir" || rc=$? ;;
demo) /out/guest/bin/odpwatch demo >"$jobdir/output" 2>&1 || rc=$? ;;
vm) (cd /odpwatch && sh "$jobdir/cmd.sh") >"$jobdir/output" 2>&1 || rc=$? ;;
cluster)
	# Both nodes boot at once; wait (up to 5 minutes) until the peer's
	# kernel answers on the wire, so neither command starts alone.
	if python3 /odpwatch/scripts/guest/wait-peer.py "$ODPWATCH_PEER" 300; then
		say "node$node: peer $ODPWATCH_PEER answers"
		(cd /odpwatch && sh "$jobdir/cmd.sh") >"$jobdir/output" 2>&1 || rc=$?
	else
		say "node$node: peer $ODPWATCH_PEER never answered"
		rc=3
	fi
	;;
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
