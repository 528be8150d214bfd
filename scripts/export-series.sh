#!/usr/bin/env bash
# Export the whole kernel change as a git format-patch series with a cover
# letter into $OUT/series, in the order of kernel-patches/series: each patch
# is applied with git am, each "add" entry commits our own files from the repo.
# The userspace series go beside it, each checked to apply to its base with
# git am: $OUT/series/rdma-core/ (libprovider/rdma-core/, Debian's rdma-core)
# and $OUT/series/libfabric/ (libprovider/libfabric/, libfabric's source).
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
# sign FILE...: the placeholder becomes the identity.
sign() {
	local who=${identity//&/\\&}
	sed -i -E "s/^(From|Signed-off-by): $placeholder\$/\\1: ${who//\//\\/}/" "$@"
}

tree=$("$TOP/scripts/materialise.sh")
work=$CACHE/series-export
scratch_at_base "$tree" "$work" series
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

covered=$(mktemp)
while read -r first second third; do
	case $first in '' | '#'*) continue ;; esac
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
		g am -q "$TOP/kernel-patches/$first" || die "patch does not apply: kernel-patches/$first"
	fi
done <"$TOP/kernel-patches/series"

# Every overlay file must be in the series.
for e in $overlay; do
	[ -d "$TOP/${e%%:*}" ] && (cd "$TOP" && find "${e%%:*}" -type f ! -name .gitkeep)
done | sort >"$covered.all"
missing=$(comm -23 "$covered.all" <(sort -u "$covered"))
rm -f "$covered" "$covered.all"
[ -z "$missing" ] || die "files in no 'add' entry of kernel-patches/series: $(echo $missing)"

rm -rf "$OUT/series" && mkdir -p "$OUT/series"
# No --base: our import commit's hash is local; the cover letter names the base.
g format-patch -q --cover-letter --zero-commit -o "$OUT/series" odpwatch-base..series
# Fill the cover letter from kernel-patches/cover-letter.txt (subject = first line).
cover=$(ls "$OUT"/series/0000-cover-letter.patch)
subject=$(head -n 1 "$TOP/kernel-patches/cover-letter.txt")
python3 - "$cover" "$subject" "$TOP/kernel-patches/cover-letter.txt" <<'PY'
import sys
path, subject, body_file = sys.argv[1:]
body = open(body_file).read().split("\n", 1)[1].strip("\n")
text = open(path).read()
text = text.replace("*** SUBJECT HERE ***", subject).replace("*** BLURB HERE ***", body)
open(path, "w").write(text)
PY
sign "$OUT"/series/*.patch
log "series: signed by $identity"
log "series: $(ls "$OUT"/series/*.patch | wc -l) files (cover letter + $(g rev-list --count odpwatch-base..series) patches) in $OUT/series"

for project in rdma-core libfabric; do
	base=$("$TOP/scripts/fetch-$project.sh")
	scratch_at_base "$base" "$CACHE/series-export-$project" series
	git -C "$CACHE/series-export-$project" -c user.name=odpwatch -c user.email=odpwatch@localhost \
		am -q "$TOP/libprovider/$project"/*.patch ||
		die "the $project series (libprovider/$project/) does not apply to its base with git am"
	mkdir -p "$OUT/series/$project"
	cp "$TOP/libprovider/$project"/*.patch "$OUT/series/$project/"
	sign "$OUT/series/$project"/*.patch
	log "series: $project: $(ls "$OUT/series/$project" | wc -l) patches in $OUT/series/$project"
done
