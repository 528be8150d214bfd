#!/usr/bin/env bash
# Fetch libfabric's upstream source as Debian's archive carries it (the orig
# tarball of trixie's libfabric, a plain export of the upstream release) and
# import it as a git tree whose one commit is tagged odpwatch-base: the base
# our libfabric series (other-projects/libfabric/) applies to with git am.
# Prints the tree's path.
. "$(dirname "$0")/../../scripts/lib.sh"

version=$LIBFABRIC_VERSION
dir=$CACHE/libfabric/base-$version
if [ ! -f "$dir/.imported" ]; then
	apt_private_update
	rm -rf "$dir" "$dir.dl" && mkdir -p "$dir" "$dir.dl"
	# Only the orig tarball is needed (and the archive may lack the rest
	# of the source package); apt checks it against the signed index.
	(cd "$dir.dl" && apt-get "${APT_OPTS[@]}" source --download-only "libfabric=$LIBFABRIC_DEBIAN_VERSION" >/dev/null 2>&1) || true
	orig=$dir.dl/libfabric_$version.orig.tar.xz
	[ -f "$orig" ] || die "download of libfabric $version's orig tarball failed (trixie deb-src on the mirror?)"
	tar -xJf "$orig" -C "$dir" --strip-components=1
	git -C "$dir" init -q
	git -C "$dir" add -A -f
	git -C "$dir" -c user.name=odpwatch -c user.email=odpwatch@localhost \
		commit -q -m "libfabric $version (Debian's orig tarball)"
	git -C "$dir" tag odpwatch-base
	rm -rf "$dir.dl"
	touch "$dir/.imported"
fi
printf '%s\n' "$dir"
