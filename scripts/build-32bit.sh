#!/usr/bin/env bash
# Build the materialised tree for a 32-bit architecture (i386 tinyconfig with
# memwatch) and link vmlinux: memwatch must build on every architecture, and
# a 64-bit-only construct (a 64-bit atomic, a u64 division, a missing entry
# in the 32-bit system call table) shows here as an error or a warning.
#   build-32bit.sh SRC BUILD
. "$(dirname "$0")/lib.sh"

src=$1 build=$2
mkdir -p "$build"
export CCACHE_DIR=${CCACHE_DIR:-$CACHE/ccache}
export CCACHE_BASEDIR=$(dirname "$src")
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G}
export KBUILD_BUILD_TIMESTAMP="odpwatch" KBUILD_BUILD_USER=odpwatch KBUILD_BUILD_HOST=odpwatch
kmake() { make -C "$src" O="$build" ARCH=i386 LOCALVERSION= CC="ccache gcc" HOSTCC="ccache gcc" -j"$(nproc)" "$@"; }

if ! grep -qx "CONFIG_SMP=y" "$build/.config" 2>/dev/null; then
	kmake -s tinyconfig >/dev/null
	# SMP: the barriers of a uniprocessor build accept what SMP ones refuse.
	"$src/scripts/config" --file "$build/.config" --enable MEMWATCH --enable SMP
	kmake -s olddefconfig >/dev/null
	for o in MEMWATCH SMP; do grep -qx "CONFIG_$o=y" "$build/.config" || die "i386: CONFIG_$o did not take"; done
fi
if ! run_with_progress "kernel: i386 build" "$build/build.log" count_cc kmake vmlinux; then
	grep -E 'error|Error|warning' "$build/build.log" | head -20 >&2
	die "the i386 build fails; log: $build/build.log"
fi
# Our files must build without a warning (the base's own are not ours to fix).
if grep -E '(mm/memwatch|kernel/ucount|syscall).*warning|warning: #warning syscall' "$build/build.log" >&2; then
	die "the i386 build warns about our code; log: $build/build.log"
fi
log "kernel: i386 vmlinux with memwatch builds ($(grep -c '^  CC ' "$build/build.log" || true) objects compiled)"
