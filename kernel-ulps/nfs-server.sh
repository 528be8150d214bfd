#!/bin/sh
# An NFSv4 server with its RDMA listener (port 20049) beside TCP (2049),
# exporting a tmpfs at /tmp/export, in a guest with no init system: what
# the packages' services would start, started by hand. The guest's /var/lib
# is a fresh tmpfs, so nfs-utils' state directories are made here.
#   nfs-server.sh start | stop
set -e
case $1 in
start)
	mkdir -p /var/lib/nfs/rpc_pipefs /var/lib/nfs/v4recovery /var/lib/nfs/sm /run/rpcbind
	touch /var/lib/nfs/etab /var/lib/nfs/rmtab
	mountpoint -q /proc/fs/nfsd || mount -t nfsd nfsd /proc/fs/nfsd
	mountpoint -q /var/lib/nfs/rpc_pipefs || mount -t rpc_pipefs sunrpc /var/lib/nfs/rpc_pipefs
	# In the foreground, in the background: their PIDs are ours to end.
	rpcbind -f >/run/ulps-rpcbind.log 2>&1 &
	echo $! >/run/ulps-rpcbind.pid
	# No client has state to reclaim: a grace period of 10 s, not 90.
	# (Without nfsdcld, which cannot watch this rpc_pipefs before nfsd
	# makes its directory, nfsd says it cannot track clients: harmless.)
	echo 10 >/proc/fs/nfsd/nfsv4gracetime
	mkdir -p /tmp/export
	mountpoint -q /tmp/export || mount -t tmpfs -o size=400m export /tmp/export
	# The export is NFSv4's root (fsid=0; clients mount server:/): the path
	# to it crosses the guest's 9p root, which nfsd cannot export.
	exportfs -i -o rw,sync,no_root_squash,no_subtree_check,insecure,fsid=0 198.51.100.0/24:/tmp/export
	rpc.mountd -F -N 2 -N 3 >/run/ulps-mountd.log 2>&1 &
	echo $! >/run/ulps-mountd.pid
	rpc.nfsd -N 3 --rdma=20049 4
	cat /proc/fs/nfsd/portlist
	;;
stop)
	rpc.nfsd 0
	exportfs -ua
	for p in mountd rpcbind; do
		[ ! -f /run/ulps-$p.pid ] || kill "$(cat /run/ulps-$p.pid)" || true
		rm -f /run/ulps-$p.pid
	done
	;;
*)
	echo "usage: nfs-server.sh start | stop" >&2
	exit 2
	;;
esac
