#!/usr/bin/env bash
# Export the kernel change as the git format-patch series kernel-patches/series
# names, each with its cover letter, into $OUT/series/NAME/: each patch is
# applied with git am, each "add" entry commits our own files from the repo.
# The userspace series go beside it, each checked to apply to its base with
# git am: $OUT/series/rdma-core/ (other-projects/rdma-core/, Debian's rdma-core)
# and $OUT/series/libfabric/ (other-projects/libfabric/, libfabric's source).
. "$(dirname "$0")/lib.sh"

# The patches go out under a person's name (Developer's Certificate of
# Origin): ODPWATCH_IDENTITY="Name <email>", or the exporter's git identity.
# The repository stores them under a placeholder, replaced here in From: and
# Signed-off-by:. Without an identity the export is refused, unless it is
# only checked (make check-series: ODPWATCH_SERIES_CHECK=1), which signs as
# "odpwatch check <check@localhost>".
placeholder='odpwatch( developers)? <odpwatch@localhost>'
identity=${ODPWATCH_IDENTITY:-}
if [ -z "$identity" ]; then
	name=$(git -C "$TOP" config user.name || true)
	email=$(git -C "$TOP" config user.email || true)
	[ -n "$name" ] && [ -n "$email" ] && identity="$name <$email>"
fi
if [ -z "$identity" ] || printf '%s\n' "$identity" | grep -qxE "$placeholder"; then
	[ -n "${ODPWATCH_SERIES_CHECK:-}" ] ||
		die "make series needs your identity for From: and Signed-off-by: git config user.name and user.email, or ODPWATCH_IDENTITY='Name <email>'"
	identity="odpwatch check <check@localhost>"
fi
printf '%s\n' "$identity" | grep -qE '^[^<>]+ <[^<> @]+@[^<> ]+>$' ||
	die "ODPWATCH_IDENTITY must read 'Name <email>', not '$identity'"
# sign FILE...: the placeholder becomes the identity: the author, and in a
# real export the maintainer a MAINTAINERS entry names (a checked export
# keeps that line, which is in the tree: make check-series compares trees).
sign() {
	local who=${identity//&/\\&} maint=
	[ -n "${ODPWATCH_SERIES_CHECK:-}" ] || maint="s/^\\+M:\t$placeholder\$/+M:\t${who//\//\\/}/"
	sed -i -E -e "s/^(From|Signed-off-by): $placeholder\$/\\1: ${who//\//\\/}/" ${maint:+-e "$maint"} "$@"
}

# fill_cover DIR TEXT WHERE: DIR's 0000-cover-letter.patch gets TEXT's first
# line as subject, the rest and the line WHERE as its body.
fill_cover() {
	python3 - "$1/0000-cover-letter.patch" "$2" "$3" <<'PY'
import sys
path, body_file, where = sys.argv[1:]
subject, body = open(body_file).read().split("\n", 1)
text = open(path).read()
text = text.replace("*** SUBJECT HERE ***", subject)
text = text.replace("*** BLURB HERE ***", body.strip("\n") + "\n\n" + where)
open(path, "w").write(text)
PY
}

# note_below PATCH TEXT WHERE: TEXT's body (its first line, a subject, left
# out) and the line WHERE go below PATCH's "---" line, before the diffstat.
note_below() {
	python3 - "$1" "$2" "$3" <<'PY'
import sys
path, body_file, where = sys.argv[1:]
body = open(body_file).read().split("\n", 1)[1].strip("\n")
text = open(path).read()
if "\n---\n" not in text:
    sys.exit(f"{path}: no '---' line")
text = text.replace("\n---\n", "\n---\n" + body + "\n\n" + where + "\n\n", 1)
open(path, "w").write(text)
PY
}

tree=$("$TOP/scripts/materialise.sh")
work=$CACHE/series-export
g() { git -C "$work" -c user.name="odpwatch developers" -c user.email=odpwatch@localhost "$@"; }

# Map a repo path to its tree path with the Kbuild overlay list.
overlay=$(overlay_entries)
tree_path() {
	local e
	for e in $overlay; do
		case $1/ in "${e%%:*}"/*) printf '%s%s\n' "${e#*:}" "${1#"${e%%:*}"}"; return ;; esac
	done
	die "$1 is under no overlay directory of Kbuild"
}

# The entries of series NAME, one per line ("PATCH" or "add DIR MSG").
entries() {
	awk -v name="$1" '$1 == "series" { cur = $2; next }
		/^[ \t]*(#|$)/ { next }
		cur == name { print }' "$TOP/kernel-patches/series"
}
# The subject tag of series NAME ("series NAME TAG ..."): PATCH TAG.
tag_of() { awk -v name="$1" '$1 == "series" && $2 == name && NF >= 3 && $3 != "on" { print $3 }' "$TOP/kernel-patches/series"; }

covered=$(mktemp)
# apply NAME: commit series NAME's entries onto the scratch tree.
apply() {
	local first second third dst
	while read -r first second third; do
		if [ "$first" = add ]; then
			[ -d "$TOP/$second" ] || die "series: add $second: no such directory"
			[ -f "$TOP/kernel-patches/messages/$third" ] || die "series: add $second: no message file messages/$third"
			dst=$(tree_path "$second")
			mkdir -p "$work/$dst"
			rsync -r --exclude=.gitkeep "$TOP/$second"/ "$work/$dst"/
			(cd "$TOP" && find "$second" -type f ! -name .gitkeep) >>"$covered"
			# -f: Debian's linux-source .gitignore ignores everything at the top level.
			g add -A -f -- "$dst"
			g commit -q -s -F "$TOP/kernel-patches/messages/$third" --no-verify
		else
			[ -f "$TOP/kernel-patches/$first" ] || die "series $1 names $first, which does not exist"
			g am -q "$TOP/kernel-patches/$first" || die "series $1: patch does not apply: kernel-patches/$first"
		fi
	done < <(entries "$1")
}

names=$(kernel_series)
[ -n "$names" ] || die "kernel-patches/series names no series"
rm -rf "$OUT/series" && mkdir -p "$OUT/series"
# Each series from its own base: the vanilla tree, or the series it is on.
for name in $names; do
	[ -f "$TOP/kernel-patches/cover-$name.txt" ] || die "series $name: no cover letter kernel-patches/cover-$name.txt"
	scratch_at_base "$tree" "$work" "series-$name"
	on=$(kernel_series_base "$name")
	chain=$(kernel_series_chain "$name")
	for b in $chain; do apply "$b"; done
	from=$(g rev-parse HEAD)
	apply "$name"
	prefix=PATCH
	tag=$(tag_of "$name")
	[ -z "$tag" ] || prefix="PATCH $tag"
	if [ -n "$on" ]; then
		where="Applies on top of $(kernel_series_chain_text "$chain")Debian's $BASE_PKG $BASE_VERSION."
	else
		where="Applies to Debian's $BASE_PKG $BASE_VERSION."
	fi
	# No --base: our import commit's hash is local; the cover letter names
	# the base. A series of one patch goes without a cover letter, its text
	# below the patch's "---", where git am leaves it out.
	n=$(g rev-list --count "$from..HEAD")
	if [ "$n" = 1 ]; then
		what="1 patch, its cover text below the ---"
		g format-patch -q --zero-commit --subject-prefix="$prefix" -o "$OUT/series/$name" "$from..HEAD"
		note_below "$OUT/series/$name"/0001-*.patch "$TOP/kernel-patches/cover-$name.txt" "$where"
	else
		g format-patch -q --cover-letter --zero-commit --subject-prefix="$prefix" \
			-o "$OUT/series/$name" "$from..HEAD"
		fill_cover "$OUT/series/$name" "$TOP/kernel-patches/cover-$name.txt" "$where"
		what="cover letter + $n patches"
	fi
	sign "$OUT/series/$name"/*.patch
	log "series: $name: $what in $OUT/series/$name${on:+ (on $on)}"
done
log "series: signed by $identity"

# Every overlay file must be in the series.
for e in $overlay; do
	[ -d "$TOP/${e%%:*}" ] && (cd "$TOP" && find "${e%%:*}" -type f ! -name .gitkeep)
done | sort >"$covered.all"
missing=$(comm -23 "$covered.all" <(sort -u "$covered"))
rm -f "$covered" "$covered.all"
[ -z "$missing" ] || die "files in no 'add' entry of kernel-patches/series: $(echo $missing)"

for project in rdma-core libfabric; do
	base=$("$TOP/other-projects/$project/fetch.sh")
	pwork=$CACHE/series-export-$project
	scratch_at_base "$base" "$pwork" series
	git -C "$pwork" -c user.name="odpwatch developers" -c user.email=odpwatch@localhost \
		am -q "$TOP/other-projects/$project"/*.patch ||
		die "the $project series (other-projects/$project/) does not apply to its base with git am"
	git -C "$pwork" -c user.name="odpwatch developers" -c user.email=odpwatch@localhost \
		format-patch -q --cover-letter --zero-commit -o "$OUT/series/$project" odpwatch-base..HEAD
	version=$RDMA_CORE_VERSION
	[ "$project" = rdma-core ] || version=$LIBFABRIC_VERSION
	fill_cover "$OUT/series/$project" "$TOP/other-projects/$project/cover-letter.txt" \
		"Applies to $project $version (Debian's source)."
	sign "$OUT/series/$project"/*.patch
	log "series: $project: cover letter + $(ls "$TOP/other-projects/$project"/*.patch | wc -l) patches in $OUT/series/$project"
done

# Every exported patch goes out under the one identity: a stored patch with
# another author (a header the placeholder did not match) would not.
others=$(grep -rL -F -x "From: $identity" "$OUT/series" --include='*.patch' || true)
[ -z "$others" ] || die "exported patches not signed by $identity (their stored author is not the placeholder): $(echo $others)"
