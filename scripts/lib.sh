# shellcheck shell=bash
# Common settings for the odpwatch build scripts: source, don't run.
set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Everything slow to make lives outside the repo, keyed so a stale entry is rebuilt.
CACHE=${ODPWATCH_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/odpwatch}
OUT=${ODPWATCH_OUT:-$TOP/out}

# The tested base: Debian's linux-source-7.3 from trixie-backports.
BASE_PKG=linux-source-7.3
BASE_VERSION=${BASE_VERSION:-7.3.4-1~bpo13+1}
# The rdma-core our series (other-projects/rdma-core/) applies to: trixie's.
RDMA_CORE_VERSION=56.1-1
# libfabric: upstream source from Debian's orig tarball (other-projects/libfabric/fetch.sh)
LIBFABRIC_VERSION=2.1.0
LIBFABRIC_DEBIAN_VERSION=2.1.0-1.1
# Guest root filesystem suite.
GUEST_SUITE=trixie

mkdir -p "$CACHE" "$OUT"

log() { printf '%s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# stage NAME CMD...: run CMD, print its name before and its duration after.
# STAGE_BUDGET (seconds, for this call only) is the stage's time budget: a
# stage over it says so loudly, and stage_table lists it at the end of the
# run. Every stage is recorded in $OUT/.stages (the run's ledger: depth,
# name, seconds, budget, exit status); $OUT/.stage-now.LANE names the stages
# in progress (a lane: make check's production or debug half, which run side
# by side), so a run stopped at its hard limit can say where it was.
stage() {
	local name=$1 t0 rc=0 took budget=${STAGE_BUDGET:-} depth=${ODPWATCH_STAGE_DEPTH:-0}
	shift
	t0=$(date +%s)
	log "==> $name${budget:+ (budget ${budget}s)}"
	local now=$OUT/.stage-now.${ODPWATCH_LANE:-main}
	printf '%s\t%s\t%s\n' "$depth" "$t0" "$name" >>"$now"
	ODPWATCH_STAGE_DEPTH=$((depth + 1)) "$@" || rc=$?
	took=$(($(date +%s) - t0))
	log "<== $name: ${took}s$([ $rc -eq 0 ] || echo ", FAILED (exit $rc)")"
	if [ -n "$budget" ] && [ "$took" -gt "$budget" ]; then
		log "!!! OVER BUDGET: stage '$name' took ${took}s, its budget is ${budget}s"
	fi
	printf '%s\t%s\t%s\t%s\t%s\n' "$depth" "$name" "$took" "${budget:--}" "$rc" >>"$OUT/.stages"
	sed -i "/^$depth\t$t0\t/d" "$now" 2>/dev/null || true
	return $rc
}

# stage_table: the run's stages from the ledger, slowest first (nested ones
# indented under nothing: each line stands alone), then those over budget.
stage_table() {
	[ -s "$OUT/.stages" ] || return 0
	log "--- stages, slowest first (seconds, budget):"
	sort -t "$(printf '\t')" -k3,3nr "$OUT/.stages" | awk -F '\t' '
		{ printf "%6ds  %-6s %s%s%s\n", $3, $4, substr("        ", 1, 2 * $1), $2, $5 == 0 ? "" : "  (FAILED)" }' >&2
	awk -F '\t' '$4 != "-" && $3 > $4 { printf "!!! stage over budget: %s: %ds > %ds\n", $2, $3, $4 }' \
		"$OUT/.stages" >&2
	cat "$OUT"/.stage-now.* 2>/dev/null | awk -F '\t' -v now="$(date +%s)" \
		'{ printf "!!! stage still running: %s: %ds so far\n", $3, now - $2 }' >&2
}

# run_with_progress LABEL LOG SUMMARY CMD...: run CMD with its output in LOG;
# every PROGRESS_INTERVAL seconds (default 50) print "LABEL: Ns, SUMMARY",
# where SUMMARY is a command run on LOG (e.g. a count of compiled objects).
# Returns CMD's status. Long quiet work must show it is alive.
run_with_progress() {
	local label=$1 logf=$2 summary=$3 pid t0 last now rc=0
	shift 3
	t0=$(date +%s) last=$t0
	"$@" >"$logf" 2>&1 &
	pid=$!
	# A background job ignores SIGINT: Ctrl-C must stop it from here.
	trap 'kill_tree $pid; exit 130' INT
	trap 'kill_tree $pid; exit 143' TERM HUP
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		now=$(date +%s)
		if [ $((now - last)) -ge "${PROGRESS_INTERVAL:-50}" ]; then
			last=$now
			log "$label: $((now - t0))s, $($summary "$logf" 2>/dev/null || true)"
		fi
	done
	wait "$pid" || rc=$?
	trap - INT TERM HUP
	return $rc
}

# kill_tree PID: stop PID and every process below it (by PID, never by name).
kill_tree() {
	local c
	kill -STOP "$1" 2>/dev/null || return 0
	for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done
	kill -TERM "$1" 2>/dev/null
	kill -CONT "$1" 2>/dev/null || true
}
# Summaries for run_with_progress.
last_line() { tail -n 1 "$1" | cut -c1-100; }
count_cc() { echo "$(grep -c '^  CC ' "$1") objects compiled"; }
ninja_step() { grep -oE '^\[[0-9]+/[0-9]+\]' "$1" | tail -n 1 | sed 's/^/step /'; }
cmake_percent() { grep -oE '^\[ *[0-9]+%\]' "$1" | tail -n 1 | tr -d '[ ]' | sed 's/$/ built/'; }

# remove_tree DIR...: rm -rf, but never through a mount. A root filesystem
# copy with a bind mount left below it (a chroot step killed by SIGKILL)
# would delete the repository, out/ or the host's /dev through it.
remove_tree() {
	local d real mounted
	for d in "$@"; do
		[ -e "$d" ] || continue
		real=$(realpath -e "$d") || die "remove_tree: cannot resolve $d"
		case $real in / | /dev | /proc | /sys | /home | /root | /usr) die "remove_tree: refusing to remove $real" ;; esac
		# Field 5 of mountinfo is the mount point, with octal escapes.
		mounted=$(awk -v dir="$real" '{ p = $5; gsub(/\\040/, " ", p)
			if (p == dir || index(p, dir "/") == 1) print p }' /proc/self/mountinfo)
		[ -z "$mounted" ] || die "refusing to remove $real: mounted below it: $(echo $mounted)
(a chroot step was killed; unmount these first: umount -R <each>)"
		rm -rf --one-file-system "$real"
	done
}

# The mirror URI from this machine's own apt configuration (deb822 first,
# then one-line sources); never a hard-coded host.
debian_mirror() {
	local uri
	uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null |
		grep -m1 . || true)
	[ -n "$uri" ] || uri=$(awk '$1 == "deb" && $0 ~ /debian/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' \
		/etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | grep -m1 . || true)
	[ -n "$uri" ] || die "no Debian mirror found in /etc/apt/sources.list.d/*.sources or sources.list"
	# Only the Debian archive proper, not debian-security or third-party repos.
	case $uri in *debian-security*) die "first apt source is the security archive; cannot derive the mirror" ;; esac
	printf '%s\n' "${uri%/}"
}

# A private apt configuration for trixie and trixie-backports (deb and deb-src),
# so the machine's own sources stay untouched.
APT_DIR=$CACHE/apt
apt_private() {
	local mirror
	mirror=$(debian_mirror)
	mkdir -p "$APT_DIR"/etc/sources.list.d "$APT_DIR"/etc/preferences.d "$APT_DIR"/etc/apt.conf.d \
		"$APT_DIR"/state/lists/partial "$APT_DIR"/cache/archives/partial
	: >"$APT_DIR"/etc/sources.list
	cat >"$APT_DIR"/etc/sources.list.d/odpwatch.sources <<-EOT
	Types: deb deb-src
	URIs: $mirror
	Suites: trixie trixie-backports
	Components: main
	Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
	EOT
}
APT_OPTS=(-o "Dir::Etc=$APT_DIR/etc" -o "Dir::State=$APT_DIR/state" -o "Dir::Cache=$APT_DIR/cache"
	-o "Dir::Etc::SourceList=$APT_DIR/etc/sources.list" -o "Dir::Etc::SourceParts=$APT_DIR/etc/sources.list.d"
	-o "Dir::State::status=/var/lib/dpkg/status" -o "APT::Sandbox::User=root" -q)

apt_private_update() {
	apt_private
	# Refresh the lists at most once an hour.
	if [ -z "$(find "$APT_DIR/state/lists" -maxdepth 1 -name '*Packages*' -mmin -60 2>/dev/null | head -1)" ]; then
		apt-get "${APT_OPTS[@]}" update >/dev/null ||
			die "apt-get update of trixie/trixie-backports failed (is the mirror reachable?)"
	fi
}

# The kernel series kernel-patches/series names ("series NAME [TAG] [on OTHER]"),
# in order; and the series NAME applies on top of (empty: the vanilla base).
kernel_series() { awk '$1 == "series" { print $2 }' "$TOP/kernel-patches/series"; }
# The patch files kernel-patches/series lists, in order (every entry but
# comments, "add" and "series" lines).
kernel_patch_entries() { awk '$1 !~ /^#/ && $1 != "add" && $1 != "series" && NF { print $1 }' "$TOP/kernel-patches/series"; }
kernel_series_base() {
	awk -v name="$1" '$1 == "series" && $2 == name { for (i = 3; i < NF; i++) if ($i == "on") print $(i + 1) }' \
		"$TOP/kernel-patches/series"
}
# The series NAME applies on, the one nearest the base first: all of its
# bases, not just the one it names.
kernel_series_chain() {
	local on chain= all
	all=" $(kernel_series | paste -sd' ') "
	on=$(kernel_series_base "$1")
	while [ -n "$on" ]; do
		case $all in *" $on "*) ;; *) die "series $1: it is on $on, which kernel-patches/series does not name" ;; esac
		case " $chain " in *" $on "*) die "series $1: its bases form a cycle ($on $chain)" ;; esac
		chain="$on${chain:+ $chain}"
		on=$(kernel_series_base "$on")
	done
	printf '%s\n' "$chain"
}
# A chain of series (kernel_series_chain's words) as the text that goes
# before the base: "the rxe series, on the rdma-fixes series, on ".
kernel_series_chain_text() {
	local b text=
	for b in $1; do text="the $b series, on $text"; done
	printf '%s' "$text"
}

# The overlay entries of Kbuild, "repo-dir:tree-dir" each, one per line.
overlay_entries() {
	make -s -f - <<<"include $TOP/Kbuild
all: ; @printf '%s\n' \$(odpwatch-overlay)"
}

# A scratch clone of the materialised tree at DIR, kept between runs and reset
# to the pristine base on BRANCH (checkout -f, clean -fdx): a fresh base tree
# without a fresh checkout of 90k files, and unchanged files keep their mtimes.
#   scratch_at_base TREE DIR BRANCH
scratch_at_base() {
	local tree=$1 dir=$2 branch=$3
	[ -d "$dir/.git" ] || git clone -q --shared --no-checkout "$tree" "$dir"
	git -C "$dir" am --abort >/dev/null 2>&1 || true
	git -C "$dir" checkout -q -f -B "$branch" odpwatch-base
	git -C "$dir" clean -q -fdx
}

# remove_stale_tmp DIR: remove DIR/*.tmp.PID left by a run that was killed
# (its PID no longer lives); a live run's copy is left alone.
remove_stale_tmp() {
	local t
	for t in "$1"/*.tmp.*; do
		[ -d "$t" ] || continue
		kill -0 "${t##*.tmp.}" 2>/dev/null && continue
		log "removing $t, left by a run that was killed"
		remove_tree "$t"
	done
}

# Short content hash of files or strings, for cache keys.
key_of() { cat "$@" | sha256sum | cut -c1-12; }

# background_kernel TREE VARIANT: build VARIANT's kernel of TREE in the
# background at idle priority (SCHED_IDLE, nice 19), logging to $OUT/.kernel-VARIANT.log;
# its PID in $OUT/.kernel-VARIANT.pid. wait_background_kernel VARIANT waits for
# it (with progress) before the foreground build of that variant, which then
# finds it done, or does what is left and reports any error itself.
background_kernel() {
	local tree=$1 variant=$2
	chrt --idle 0 nice -n 19 "$TOP/scripts/build-kernel.sh" "$tree" "$(dirname "$tree")/build-$variant" "$variant" \
		>"$OUT/.kernel-$variant.log" 2>&1 </dev/null &
	echo $! >"$OUT/.kernel-$variant.pid"
	log "kernel: the $variant kernel builds in the background at idle priority (pid $!, log $OUT/.kernel-$variant.log)"
}
# background_kernel_pid VARIANT: the PID of that build while it runs, else
# nothing (a PID reused by another process is not ours to wait for or stop).
background_kernel_pid() {
	local pid
	pid=$(cat "$OUT/.kernel-$1.pid" 2>/dev/null) || return 0
	{ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -q build-kernel.sh && echo "$pid"
	return 0
}
# promote_background_kernel VARIANT: that build at normal priority from now
# on (make and what runs under it; what make starts later inherits it).
promote_background_kernel() {
	local pid
	pid=$(background_kernel_pid "$1")
	[ -n "$pid" ] || return 0
	promote_tree "$pid"
	log "kernel: the $1 kernel's background build goes on at normal priority"
}
promote_tree() {
	local c
	# A process of the tree may end between ps and these: not an error
	# (under set -e the failing renice of an && list ended the lane).
	chrt --other -p 0 "$1" >/dev/null 2>&1 || true
	renice -n 0 -p "$1" >/dev/null 2>&1 || true
	for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do promote_tree "$c"; done
	return 0
}
wait_background_kernel() {
	local pidf=$OUT/.kernel-$1.pid pid t0 last now
	pid=$(background_kernel_pid "$1")
	[ -n "$pid" ] || { rm -f "$pidf"; return 0; }
	t0=$(date +%s) last=$t0
	log "kernel: waiting for the $1 kernel's background build (pid $pid)"
	while kill -0 "$pid" 2>/dev/null; do
		sleep 2
		now=$(date +%s)
		if [ $((now - last)) -ge "${PROGRESS_INTERVAL:-50}" ]; then
			last=$now
			log "kernel: background build ($1): waited $((now - t0))s, $(last_line "$OUT/.kernel-$1.log")"
		fi
	done
	rm -f "$pidf"
	log "kernel: the $1 kernel's background build ended after $(($(date +%s) - t0))s of waiting"
}
# stop_background_kernel VARIANT: a run that ends early stops the build it started.
stop_background_kernel() {
	local pid
	pid=$(background_kernel_pid "$1")
	if [ -n "$pid" ]; then
		log "stopping the $1 kernel's background build (pid $pid)"
		kill_tree "$pid"
	fi
	rm -f "$OUT/.kernel-$1.pid"
}
