#!/usr/bin/env bash
# Compile our code for a 32-bit architecture (i386 tinyconfig with memwatch):
# memwatch must build on every architecture. A 64-bit-only construct shows
# here as a compiler error or warning, a u64 division as a call to libgcc's
# 64-bit helpers (which the kernel does not link), and a missing entry in the
# 32-bit system call table as a table without memwatch_create.
# The objects, not vmlinux: linking a whole tinyconfig kernel compiles some
# 460 objects of the base, minutes on a cold run, to check a handful of ours
# (what only a link would find beyond the two checks below goes unseen).
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
	for o in MEMWATCH SMP MMU_NOTIFIER; do grep -qx "CONFIG_$o=y" "$build/.config" || die "i386: CONFIG_$o did not take"; done
fi
# What the memwatch series adds or changes and this config builds; W=1 as
# for the production kernel's own files.
objs="mm/memwatch.o mm/mmu_notifier.o kernel/ucount.o kernel/sys_ni.o arch/x86/entry/syscall_32.o"
# Compiled every time (ccache makes it cheap), so that their warnings show.
(cd "$build" && rm -f $objs)
if ! run_with_progress "kernel: i386 objects" "$build/build.log" count_cc kmake W=1 $objs; then
	grep -E 'error|Error|warning' "$build/build.log" | head -20 >&2
	die "i386: our objects do not build; log: $build/build.log"
fi
if grep -E 'warning' "$build/build.log" >&2; then
	die "i386: our objects build with warnings; log: $build/build.log"
fi
# 64-bit arithmetic the compiler left to libgcc: the kernel links no libgcc.
helpers=$(nm -u "$build/mm/memwatch.o" | grep -E ' __[a-z]+[sd]i[234]$' || true)
[ -z "$helpers" ] || die "i386: mm/memwatch.o calls libgcc's 64-bit helpers, which the kernel does not link: $helpers"
# The 32-bit table calls memwatch_create's entry, and memwatch.o defines it.
[[ "$(nm "$build/arch/x86/entry/syscall_32.o")" == *" U __ia32_sys_memwatch_create"* ]] ||
	die "i386: the 32-bit system call table has no memwatch_create"
[[ "$(nm "$build/mm/memwatch.o")" == *" T __ia32_sys_memwatch_create"* ]] ||
	die "i386: mm/memwatch.o does not define __ia32_sys_memwatch_create"
log "kernel: i386 objects of memwatch build without a warning, with no libgcc helper, and the 32-bit table calls memwatch_create ($(grep -c '^  CC ' "$build/build.log" || true) objects compiled)"
