#!/usr/bin/env bash
# Materialise the kernel tree: the base as a git repository (tag odpwatch-base),
# the patch series applied with git am, our own files overlaid on top.
# Incremental: unchanged files keep their mtimes, so make rebuilds only what
# changed. Prints the tree's path.
. "$(dirname "$0")/lib.sh"

base=$("$TOP/scripts/fetch-base.sh")
case $base in
"$CACHE"/base/*) root=$CACHE/kernel/$(basename "$base") ;;
*) root=$CACHE/kernel/custom-$(printf '%s' "$base" | key_of) ;; # a BASE= directory, imported once
esac
tree=${TREE:-$root/src}
mkdir -p "$(dirname "$tree")"

git_q() { git -C "$tree" -c user.name=odpwatch -c user.email=odpwatch@localhost "$@"; }

if [ ! -f "$tree/.git/odpwatch-base-ready" ]; then
	log "materialise: importing base $(basename "$base") into $tree (once)"
	remove_tree "$tree" && mkdir -p "$tree"
	import_base() {
		rsync -a --exclude=/.git --exclude=/.extracted "$base"/ "$tree"/ &&
			git_q init -q -b odpwatch && git_q add -A -f . &&
			git_q commit -q -m "base: $(basename "$base")"
	}
	files_in_tree() { echo "$(find "$tree" -path "$tree/.git" -prune -o -type f -print | wc -l) files copied"; }
	run_with_progress "materialise: import" "$(dirname "$tree")/import.log" files_in_tree import_base ||
		die "import of the base failed; log: $(dirname "$tree")/import.log"
	git_q tag -f odpwatch-base >/dev/null
	touch "$tree/.git/odpwatch-base-ready"
fi

# The series: re-applied from the base only when it changed.
series=$TOP/kernel-patches/series
patches=()
for p in $(kernel_patch_entries); do
	[ -f "$TOP/kernel-patches/$p" ] || die "kernel-patches/series names $p, which does not exist"
	patches+=("$TOP/kernel-patches/$p")
done
want=$(key_of "$series" ${patches[@]+"${patches[@]}"})
have=$(cat "$tree/.git/odpwatch-series-key" 2>/dev/null || true)
if [ "$want" != "$have" ]; then
	log "materialise: applying ${#patches[@]} patch(es) to the base"
	git_q am --abort >/dev/null 2>&1 || true
	git_q checkout -q -f -B odpwatch odpwatch-base
	for p in ${patches[@]+"${patches[@]}"}; do
		if ! git_q am -q --keep-cr "$p" >/dev/null 2>"$tree/.git/am.err"; then
			cat "$tree/.git/am.err" >&2
			git_q am --abort >/dev/null 2>&1 || true
			die "patch does not apply: kernel-patches/$(basename "$p")"
		fi
	done
	echo "$want" >"$tree/.git/odpwatch-series-key"
fi

# Overlay our files; --checksum leaves unchanged files (and their mtimes) alone.
manifest=$tree/.git/odpwatch-overlay-files
new_manifest=$(mktemp)
for entry in $(overlay_entries); do
	src=$TOP/${entry%%:*} dst=$tree/${entry#*:}
	[ -d "$src" ] || continue
	(cd "$src" && find . -type f ! -name '.gitkeep' -printf "${entry#*:}/%P\n") >>"$new_manifest"
	rsync -rc --exclude=.gitkeep "$src"/ "$dst"/
done
# Files we used to overlay but no longer have: restore the base or delete.
if [ -f "$manifest" ]; then
	comm -23 <(sort -u "$manifest") <(sort -u "$new_manifest") | while read -r f; do
		if git_q cat-file -e "HEAD:$f" 2>/dev/null; then git_q checkout -q HEAD -- "$f"; else rm -f "$tree/$f"; fi
	done
fi
sort -u "$new_manifest" >"$manifest" && rm -f "$new_manifest"
printf '%s\n' "$tree"
