#!/bin/sh
# Diagnostic, run in the guest: perftest-pair.sh [ib_write_bw args], e.g. -s 65536 -n 2000 --odp
# ib_write_bw between two processes over rxe0, optionally with --odp; samples
# the rxe counters and the processes' kernel stacks while it runs.
GID=$(for i in 0 1 2 3; do t=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null); g=$(cat /sys/class/infiniband/rxe0/ports/1/gids/$i); case "$t:$g" in "RoCE v2:0000:0000:0000:0000:0000:ffff:"*) echo $i; break;; esac; done)
C=/sys/class/infiniband/rxe0/ports/1/hw_counters
echo "gid index $GID; args: $*"
r0=$(cat $C/rcvd_rnr_err); t0=$(date +%s)
ib_write_bw -d rxe0 -x $GID "$@" >/tmp/server.log 2>&1 &
sleep 1
timeout ${WBW_TIMEOUT:-600} ib_write_bw -d rxe0 -x $GID "$@" 127.0.0.1 >/tmp/client.log 2>&1 &
client=$!
n=0
while kill -0 $client 2>/dev/null; do
	sleep 1; n=$((n + 1))
	[ $((n % ${WBW_SAMPLE:-60})) = 0 ] || continue
	echo "--- t=${n}s: $(for c in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_seq_err completer_retry_err retry_exceeded_err rcvd_rnr_err send_rnr_err; do printf '%s=%s ' $c $(cat $C/$c); done)"
	for p in $(pgrep ib_write_bw); do echo "pid $p state $(awk '{print $3}' /proc/$p/stat) wchan $(cat /proc/$p/wchan)"; cat /proc/$p/stack 2>/dev/null | head -8; done
	top -b -n 1 | head -12 | tail -6
done
wait $client
echo "client exit $? after $(( $(date +%s) - t0 )) s; RNR NAKs $(( $(cat $C/rcvd_rnr_err) - r0 ))"
grep -A2 "#bytes" /tmp/client.log | tail -2
tail -n 3 /tmp/client.log /tmp/server.log
for c in odp_page_faults odp_page_faults_handled rcvd_seq_err completer_retry_err retry_exceeded_err; do echo "$c $(cat $C/$c 2>/dev/null)"; done
pkill ib_write_bw; wait
