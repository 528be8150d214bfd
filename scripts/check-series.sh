#!/usr/bin/env bash
# Check the exported series the way their maintainers would use them: each
# applies with git am to a fresh base tree (or on top of the series it names),
# and all of them in order yield the materialised tree (the one built and tested).
#   check-series.sh [--fixes]
# --fixes (make check-series): also build the rdma fixes series on the vanilla
# base step by step: the base itself (its kernel kept for the fix_* tests),
# each fix's rxe objects, and the kernel with all the fixes, kept too; run.sh
# boots both. Then every series that applies on the fixes (rxe, rdma,
# rxe-import), each on its own chain, step by step: drivers/infiniband
# compiled after each of its patches. make check leaves this out: a full
# kernel build of a tree ccache shares little with ours (our series changes
# widely included headers).
. "$(dirname "$0")/lib.sh"

fixes_too=0
[ "${1:-}" = --fixes ] && fixes_too=1

export ODPWATCH_SERIES_CHECK=1
stage "export series" "$TOP/scripts/export-series.sh"
tree=$(cat "$OUT/.tree" 2>/dev/null || "$TOP/scripts/materialise.sh")
# A scratch clone for git am, kept between runs (reset to the base each time).
root=$(dirname "$tree")/series-check
mkdir -p "$root"
g() { git -C "$root/src" -c user.name=reviewer -c user.email=reviewer@localhost "$@"; }
series_list=$(kernel_series)
# am_series NAME [EACH]: git am series NAME's exported patches; EACH, if
# given (a command and its words), is run after every patch with the patch's
# path appended.
am_series() {
	local p
	for p in "$OUT/series/$1"/0*.patch; do
		case $p in *0000-cover-letter.patch) continue ;; esac
		g am -q "$p" || die "series $1 does not apply with git am: $(basename "$p")"
		[ -z "${2:-}" ] || $2 "$p"
	done
}

# Each series alone, on the base it names.
for name in $series_list; do
	scratch_at_base "$tree" "$root/src" "review-$name"
	chain=$(kernel_series_chain "$name")
	for b in $chain; do am_series "$b"; done
	am_series "$name"
	log "series: $name applies with git am on $(kernel_series_chain_text "$chain")the base"
done

# All of them: the tree we build and test, exactly.
scratch_at_base "$tree" "$root/src" review
for name in $series_list; do am_series "$name"; done
# (A copy of the tree's index, so git add only hashes what changed.)
index=$(mktemp)
cp "$tree/.git/index" "$index"
want=$(cd "$tree" && GIT_INDEX_FILE=$index git add -A -f . && GIT_INDEX_FILE=$index git write-tree)
rm -f "$index"
have=$(g rev-parse 'HEAD^{tree}')
if [ "$want" != "$have" ]; then
	g diff --stat "$have" "$want" >&2 || true
	die "the series' tree differs from the materialised tree"
fi
# The same git tree as the one make check built and booted: building it
# again would compile the same sources a second time and prove nothing more.
log "series: $(echo $series_list) in order yield the tested tree ($have), which make check builds"
[ $fixes_too = 1 ] || exit 0

# The fixes series on the vanilla base, in a tree of its own (kept between
# runs, so only what a fix touches is compiled again).
fixes=$OUT/rdma-fixes
rm -rf "$fixes" && mkdir -p "$fixes"
vroot=$(dirname "$tree")/fixes-check
mkdir -p "$vroot"
g() { git -C "$vroot/src" -c user.name=reviewer -c user.email=reviewer@localhost "$@"; }
scratch_at_base "$tree" "$vroot/src" vanilla
stage "build the vanilla base" "$TOP/scripts/build-kernel.sh" "$vroot/src" "$vroot/build" vanilla >"$fixes/.bzimage"
cp "$(cat "$fixes/.bzimage")" "$fixes/vanilla.bzImage"
# compile_step SERIES PATCH: drivers/infiniband (the core and rxe) after PATCH.
compile_step() {
	"$TOP/scripts/build-kernel.sh" "$vroot/src" "$vroot/build" vanilla drivers/infiniband/ ||
		die "drivers/infiniband does not build after $(basename "$2") of the $1 series"
	log "series: $1: drivers/infiniband builds after $(basename "$2")"
}
am_series rdma-fixes "compile_step rdma-fixes"
stage "build the vanilla base with the fixes" "$TOP/scripts/build-kernel.sh" "$vroot/src" "$vroot/build" vanilla >"$fixes/.bzimage"
cp "$(cat "$fixes/.bzimage")" "$fixes/fixes.bzImage"
rm -f "$fixes/.bzimage"
log "series: kernels for the fix_* tests: $fixes/vanilla.bzImage, $fixes/fixes.bzImage"
# Every series on the fixes, each on its own chain (the fixes, then the
# series it names, applied without compiling), every step of its own
# compiled: each is a kernel a bisection may stop at. (Their tests run on
# the whole stack, in make check.)
fixes_head=$(g rev-parse HEAD)
for name in $(kernel_series); do
	chain=$(kernel_series_chain "$name")
	case " $chain " in *" rdma-fixes "*) ;; *) continue ;; esac
	g checkout -q -B "fixes-$name" "$fixes_head"
	for b in $chain; do [ "$b" = rdma-fixes ] || am_series "$b"; done
	am_series "$name" "compile_step $name"
	log "series: $name: every step builds on the vanilla base with ${chain// / and }"
done
