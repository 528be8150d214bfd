#!/usr/bin/env bash
# Check the exported series the way a reviewer would use it: git am onto a
# fresh base tree, compare the result with the materialised tree, build it.
. "$(dirname "$0")/lib.sh"

export ODPWATCH_SERIES_CHECK=1
stage "export series" "$TOP/scripts/export-series.sh"
tree=$(cat "$OUT/.tree" 2>/dev/null || "$TOP/scripts/materialise.sh")
# Laid out like the main tree (src/ and build-std/ side by side) so ccache hits.
root=$(dirname "$tree")/series-check
mkdir -p "$root"
scratch_at_base "$tree" "$root/src" review
g() { git -C "$root/src" -c user.name=reviewer -c user.email=reviewer@localhost "$@"; }
for p in "$OUT"/series/0*.patch; do
	case $p in *0000-cover-letter.patch) continue ;; esac
	g am -q "$p" || die "the exported series does not apply with git am: $(basename "$p")"
done
# The tree the series produces must be exactly the tree we build and test.
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
log "series: applies to the base with git am and yields the tested tree ($have)"
stage "build the series' tree" "$TOP/scripts/build-kernel.sh" "$root/src" "$root/build-std" std >/dev/null
