#!/bin/sh
# A cluster node with nothing to run but its sshd: wait until FILE (the other
# node's last result, seen through the shared /out) exists, at most SECONDS
# (default 3000; the guest's own deadline is the host's TIMEOUT).
#   wait-for-file.sh FILE [SECONDS]
limit=${2:-3000} waited=0
while [ ! -e "$1" ]; do
	if [ "$waited" -ge "$limit" ]; then
		echo "wait-for-file: $1 did not appear within ${limit}s (the other node's run ended or hung)" >&2
		exit 1
	fi
	sleep 2
	waited=$((waited + 2))
done
