#!/usr/bin/env bash
# Boot two guests joined by a private Ethernet wire and run one command on
# each: node 0 and node 1, each with one virtio-net NIC whose frames QEMU
# carries as datagrams between two unix sockets in the job's directory. No
# host network is involved: no tap, no host address, nothing routed. Each
# guest puts rxe on its eth0 (MTU 9000, so the active IB MTU is 4096).
#   run-cluster.sh DIR BZIMAGE ROOTFS
# DIR (under $OUT) holds node0/cmd.sh and node1/cmd.sh; each node's console,
# output and status land in DIR/nodeN/. The run fails if either node fails
# or dies. A node that dies (or finishes) leaves the other GRACE seconds
# (default 300) to finish; TIMEOUT (default 1800) is the common deadline.
# Env: TIMEOUT, GRACE, VM_MEM (default 2G per node), ODPWATCH_APPEND_NODE0
# and ODPWATCH_APPEND_NODE1 (more of that node's kernel command line).
. "$(dirname "$0")/lib.sh"

dir=$OUT/$1 kernel=$2 rootfs=$3
timeout=${TIMEOUT:-1800} grace=${GRACE:-300}
wire=$dir/wire
# A unix socket's path holds at most 107 bytes: from a deep checkout the
# sockets go to a private directory of their own under /tmp instead.
if [ ${#wire} -gt 90 ]; then
	wire=$(mktemp -d /tmp/odpwatch-wire.XXXXXX)
	log "cluster: $dir/wire is too long a path for unix sockets; using $wire"
fi
mkdir -p "$wire"
share() { echo "-fsdev local,id=$1,path=$2,security_model=passthrough$3 -device virtio-9p-pci,fsdev=$1,mount_tag=$1"; }

pids=() tpids=()
stop_all() {
	local p
	for p in "${pids[@]}"; do
		if kill -0 "$p" 2>/dev/null; then
			kill "$p" 2>/dev/null
			for _ in 1 2 3 4 5; do kill -0 "$p" 2>/dev/null || break; sleep 1; done
			kill -KILL "$p" 2>/dev/null || true
			log "cluster: stopped QEMU (pid $p)"
		fi
	done
	for p in "${tpids[@]}"; do kill "$p" 2>/dev/null || true; done
	case $wire in /tmp/odpwatch-wire.*) rm -rf "$wire" ;; esac
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

for n in 0 1; do
	nd=$dir/node$n
	mkdir -p "$nd"
	rm -f "$nd/status" "$nd/console.log" "$nd/output" "$wire/node$n.sock"
	[ -f "$nd/cmd.sh" ] || die "cluster: no command for node $n ($nd/cmd.sh)"
done
for n in 0 1; do
	nd=$dir/node$n peer=$((1 - n)) append=ODPWATCH_APPEND_NODE$n
	# shellcheck disable=SC2046
	qemu-system-x86_64 -machine pc -accel tcg,thread=multi -cpu max -smp 1 -m "${VM_MEM:-2G}" \
		-display none -no-reboot -monitor none -serial "file:$nd/console.log" -kernel "$kernel" \
		-netdev "dgram,id=wire,local.type=unix,local.path=$wire/node$n.sock,remote.type=unix,remote.path=$wire/node$peer.sock" \
		-device "virtio-net-pci,netdev=wire,mac=52:54:00:0d:90:0$n" \
		-append "console=ttyS0 no5lvl pci=noacpi root=rootfs rootfstype=9p rootflags=trans=virtio,version=9p2000.L,msize=512000,cache=loose ro init=/sbin/odpwatch-init panic=-1 odpwatch.job=cluster odpwatch.dir=$1/node$n odpwatch.node=$n${!append:+ ${!append}}" \
		$(share rootfs "$rootfs" ,readonly=on) $(share odpwatch "$TOP" ,readonly=on) $(share out "$OUT" "") \
		</dev/null >"$nd/qemu.log" 2>&1 &
	pids+=($!)
	tail -n +1 -F --pid=$! "$nd/console.log" 2>/dev/null | sed -u "s/\r$//; s/^/node$n: /" |
		grep --line-buffered -E '^node[01]: (\[ *[0-9.]+\] )?(odpwatch:|kmemleak: [0-9]+ new suspected|BUG:|WARNING:|Oops|Kernel panic)' &
	tpids+=($!)
done
log "cluster: node0 (QEMU pid ${pids[0]}) and node1 (QEMU pid ${pids[1]}) joined by $wire"

t0=$(date +%s) last=$t0 first_end="" why=""
leader=${ODPWATCH_LEADER:-}
while :; do
	now=$(date +%s)
	alive=0
	for i in 0 1; do kill -0 "${pids[$i]}" 2>/dev/null && alive=$((alive + 1)); done
	[ $alive = 0 ] && break
	if [ $alive = 1 ] && [ -z "$first_end" ]; then
		first_end=$now
		for i in 0 1; do
			kill -0 "${pids[$i]}" 2>/dev/null && continue
			if [ ! -f "$dir/node$i/status" ]; then
				# A crash: the other will wait for a peer that is gone.
				why="node$i stopped without finishing its job"
				log "cluster: $why: stopping node$((1 - i))"
				break 2
			fi
			log "cluster: node$i finished (status $(cat "$dir/node$i/status")); node$((1 - i)) has ${grace}s"
		done
	fi
	if [ -n "$first_end" ] && [ $((now - first_end)) -ge "$grace" ]; then
		why="one node did not finish within ${grace}s of the other"
		break
	fi
	if [ $((now - t0)) -ge "$timeout" ]; then
		why="the cluster did not finish within ${timeout}s"
		break
	fi
	if [ -n "$leader" ] && ! kill -0 "$leader" 2>/dev/null; then
		log "cluster: the run's leader (pid $leader) is gone: stopping both nodes"
		exit 130
	fi
	if [ $((now - last)) -ge "${PROGRESS_INTERVAL:-50}" ]; then
		last=$now
		log "cluster: running $((now - t0))s of ${timeout}s"
	fi
	sleep 1
done
stop_all
sleep 1
rc=0
for n in 0 1; do
	st=$(cat "$dir/node$n/status" 2>/dev/null || echo none)
	log "cluster: node$n status $st; console $dir/node$n/console.log"
	if [ "$st" != 0 ]; then
		rc=1
		[ "$st" != none ] || { echo "--- node$n: last console lines"; tail -n 20 "$dir/node$n/console.log" | tr -d '\r'; } >&2
	fi
done
[ -z "$why" ] || { log "cluster: $why"; rc=1; }
log "cluster: ran $(($(date +%s) - t0))s"
exit $rc
