#!/bin/sh
# A cluster node with nothing to run but its sshd: wait until FILE (the other
# node's last result, seen through the shared /out) exists.
#   wait-for-file.sh FILE
while [ ! -e "$1" ]; do sleep 2; done
