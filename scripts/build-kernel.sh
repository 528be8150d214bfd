#!/usr/bin/env bash
# Build the materialised kernel: configure from our fragments (only when they
# change), build bzImage and the uAPI headers with ccache.
#   build-kernel.sh SRC BUILD VARIANT [DIR/]
# VARIANT: std, debug, or vanilla (a tree without our series: std's options
# but memwatch's). With DIR/ only the objects of that directory are built
# (check-series compiles each step of a series so).
. "$(dirname "$0")/lib.sh"

src=$1 build=$2 variant=$3 only=${4:-}
frags=("$TOP/configs/kernel.config")
case $variant in
std) ;;
debug) frags+=("$TOP/configs/debug.config") ;;
vanilla) frags=("$build/vanilla.config") ;;
*) die "build-kernel.sh: unknown variant $variant" ;;
esac
# One build of a build directory at a time: make check's background build of
# the debug kernel and a later (or leftover) build of the same one wait for
# each other instead of writing the same objects.
mkdir -p "$(dirname "$build")"
exec 9>"$build.lock"
if ! flock -n 9; then
	log "kernel: another build of $build is running; waiting for it"
	flock 9
fi
# A build cut off by a shutdown can leave truncated objects newer than their
# sources, which make takes as done; such a tree is built again from scratch.
building=$build/.odpwatch-building
if [ -f "$building" ]; then
	log "kernel: the last build in $build did not finish; building from scratch"
	remove_tree "$build"
fi
mkdir -p "$build"
if [ "$variant" = vanilla ]; then
	grep -v '^CONFIG_MEMWATCH=' "$TOP/configs/kernel.config" |
		sed 's/^CONFIG_LOCALVERSION=.*/CONFIG_LOCALVERSION="-vanilla"/' >"$build/vanilla.config"
fi

export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache}
# Paths relative to the tree's parent, so trees laid out alike share hits.
export CCACHE_BASEDIR=$(dirname "$src")
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G}
export KBUILD_BUILD_TIMESTAMP="odpwatch" KBUILD_BUILD_USER=odpwatch KBUILD_BUILD_HOST=odpwatch
# LOCALVERSION set (even empty) keeps setlocalversion from appending "+".
kmake() { make -C "$src" O="$build" LOCALVERSION= CC="ccache gcc" HOSTCC="ccache gcc" -j"$(nproc)" "$@"; }

# The options we asked for that .config does not have. An option named twice
# (kernel.config, then debug.config) keeps the last value.
config_missing() {
	local bad
	bad=$(cat "${frags[@]}" | grep -E '^CONFIG_|^# CONFIG_.* is not set' |
		awk '{ opt = $1 == "#" ? $2 : $1; sub(/=.*/, "", opt); last[opt] = $0 }
			END { for (o in last) print last[o] }' | sort | while read -r line; do
		case $line in
		'# '*) opt=${line#\# }; opt=${opt%% *}
			grep -q "^$opt=" "$build/.config" && echo "$opt (wanted unset)" ;;
		*) grep -qxF "$line" "$build/.config" || echo "$line" ;;
		esac
	done | sort -u)
	for o in $bad; do case $o in CONFIG_LOCALVERSION=*) ;; *) echo "$o" ;; esac; done
}

# Configured again when the fragments change, and when .config lost an
# option: a build of a tree whose Kconfig lacks one (an early step of a
# series, built in this directory) drops it from .config (syncconfig), and
# the next build would otherwise go on without it.
want=$(key_of "${frags[@]}")
if [ "$(cat "$build/.odpwatch-config-key" 2>/dev/null)" != "$want" ] || [ ! -f "$build/.config" ] ||
	[ -n "$(config_missing)" ]; then
	log "kernel: configuring ($variant): tinyconfig + ${frags[*]##*/}"
	kmake -s tinyconfig >/dev/null
	"$src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" "${frags[@]}" >"$build/merge.log" 2>&1
	kmake -s olddefconfig >/dev/null
	# Every option we asked for must have survived olddefconfig.
	bad=$(config_missing)
	[ -z "$bad" ] || die "config options that did not take (missing dependency?): $(echo $bad)"
	echo "$want" >"$build/.odpwatch-config-key"
fi

if [ -n "$only" ]; then
	touch "$building"
	kmake "$only" >"$build/build-only.log" 2>&1 || {
		tail -n 25 "$build/build-only.log" >&2
		die "kernel: building $only failed in $build"
	}
	rm -f "$building"
	exit 0
fi

# A full build compiles a few thousand objects: progress is counted against
# the last full build of this variant (kept in the cache beside ccache).
full=$CACHE/kernel-objects-$variant
objects() { echo "$(count_cc "$1")$([ -f "$full" ] && echo " (a full build: $(cat "$full"))")"; }
log "kernel: building bzImage and headers ($variant) in $build"
touch "$building"
if ! run_with_progress "kernel: build ($variant)" "$build/build.log" objects kmake bzImage; then
	grep -E 'error|Error' "$build/build.log" | head -40 >&2
	echo "--- the end of $build/build.log:" >&2
	tail -n 25 "$build/build.log" >&2
	# An incremental build can fail on what an earlier one left behind (CI at
	# 505b198: vmlinux failed to link after 11 s); one retry from scratch
	# (ccache keeps it short) tells that apart from a real error.
	if [ -z "${ODPWATCH_KERNEL_RETRY:-}" ]; then
		log "kernel: build failed; once more from scratch in an empty $build"
		remove_tree "$build"
		ODPWATCH_KERNEL_RETRY=1 exec "$0" "$@"
	fi
	die "kernel build failed from scratch too; full log: $build/build.log"
fi
rm -f "$building"
n=$(grep -c '^  CC ' "$build/build.log" || true)
log "kernel: $n objects compiled"
# A build that compiled more than half of the last full one counts as full.
[ -f "$full" ] && [ "$n" -le $(($(cat "$full") / 2)) ] || echo "$n" >"$full"
kmake -s headers >>"$build/build.log" 2>&1 || die "make headers failed; log: $build/build.log"
# Collect the build's warnings for review (the base has some of its own).
if grep -E 'warning:' "$build/build.log" >"$build/warnings.log"; then
	log "kernel: $(wc -l <"$build/warnings.log") warning line(s), see $build/warnings.log"
fi
printf '%s\n' "$build/arch/x86/boot/bzImage"
