#!/usr/bin/env bash
# Write the commits of the materialised kernel tree back into kernel-patches/:
# the way to change what only the patches hold (rxe's ODP lives in rxe_odp.c,
# grown in place by the rdma series). Edit in the tree, fold the change into
# the commit it belongs to (git commit --fixup=COMMIT; git rebase -i
# --autosquash odpwatch-base), then run this. Each commit goes back to the
# patch file whose subject it has; a commit no listed patch has is refused
# (list a new patch in kernel-patches/series first, then run this again).
#   refresh-patches.sh [TREE]
. "$(dirname "$0")/lib.sh"

tree=${1:-$(cat "$OUT/.tree" 2>/dev/null || true)}
[ -n "$tree" ] && [ -d "$tree/.git" ] || die "no materialised tree (any make job makes one; or name one)"
# Our own files are overlaid untracked: a tracked change is an uncommitted edit.
git -C "$tree" diff --quiet HEAD || die "$tree has uncommitted changes to upstream files: commit them first"

# A patch's subject, its folded header lines joined.
subject_of() { awk '/^Subject: /{ s = $0; while ((getline l) > 0 && l ~ /^ /) s = s l; sub(/^Subject: \[PATCH\] /, "", s); print s; exit }' "$1"; }
declare -A file_of=()
for p in $(kernel_patch_entries); do
	file_of[$(subject_of "$TOP/kernel-patches/$p")]=$p
done

n=0
for c in $(git -C "$tree" rev-list --reverse odpwatch-base..HEAD); do
	s=$(git -C "$tree" log -1 --format=%s "$c")
	p=${file_of[$s]:-}
	[ -n "$p" ] || die "commit $c ($s) is no patch of kernel-patches/series"
	new=$(mktemp)
	git -C "$tree" format-patch -1 --zero-commit --stdout "$c" >"$new"
	# Unchanged but for blob hashes: left alone.
	if cmp -s <(grep -v '^index ' "$new") <(grep -v '^index ' "$TOP/kernel-patches/$p"); then
		rm -f "$new"
	else
		mv "$new" "$TOP/kernel-patches/$p"
		log "refresh-patches: kernel-patches/$p"
		n=$((n + 1))
	fi
done
log "refresh-patches: $n patch(es) rewritten"
