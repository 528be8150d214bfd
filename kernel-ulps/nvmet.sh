#!/bin/sh
# An NVMe over fabrics target made through configfs, as an administrator
# makes one: subsystem $NQN with two namespaces, a memory-backed null_blk
# (1) and a file on tmpfs (2), open to any host; ports added and removed
# one by one.
#   nvmet.sh setup | port ID TRTYPE ADDR SVCID | unport ID | teardown
set -e
NQN=nqn.2026-11.org.odpwatch:kernel-ulps
C=/sys/kernel/config/nvmet
B=/sys/kernel/config/nullb/ulpsnull
S=$C/subsystems/$NQN
case $1 in
setup)
	mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
	"$0" teardown # what a failed test may have left
	# Memory-backed: null_blk's default device reads back zeros.
	mkdir $B
	echo 64 >$B/size # MiB
	echo 1 >$B/memory_backed
	echo 4096 >$B/blocksize
	echo 1 >$B/power
	truncate -s 64M /tmp/ulps-ns2.img
	mkdir $S
	echo 1 >$S/attr_allow_any_host
	for ns in 1 2; do
		mkdir $S/namespaces/$ns
		if [ $ns = 1 ]; then dev=/dev/ulpsnull; else dev=/tmp/ulps-ns2.img; fi
		printf %s $dev >$S/namespaces/$ns/device_path
		echo 1 >$S/namespaces/$ns/enable
	done
	;;
port)
	p=$C/ports/$2
	mkdir "$p"
	echo "$3" >"$p/addr_trtype"
	echo ipv4 >"$p/addr_adrfam"
	echo "$4" >"$p/addr_traddr"
	echo "$5" >"$p/addr_trsvcid"
	ln -s $S "$p/subsystems/$NQN"
	;;
unport)
	rm "$C/ports/$2/subsystems/$NQN"
	rmdir "$C/ports/$2"
	;;
teardown)
	# Whatever is there, in order; a piece already gone is no error, so a
	# test that failed half-way leaves the next one a clean target.
	for p in "$C"/ports/*; do
		[ -d "$p" ] || continue
		rm -f "$p/subsystems/$NQN"
		rmdir "$p" || true
	done
	for ns in "$S"/namespaces/*; do
		[ -d "$ns" ] || continue
		echo 0 >"$ns/enable" || true
		rmdir "$ns" || true
	done
	[ ! -d "$S" ] || rmdir "$S"
	if [ -d $B ]; then
		echo 0 >$B/power || true
		rmdir $B
	fi
	rm -f /tmp/ulps-ns2.img
	;;
*)
	echo "usage: nvmet.sh setup | port ID TRTYPE ADDR SVCID | unport ID | teardown" >&2
	exit 2
	;;
esac
