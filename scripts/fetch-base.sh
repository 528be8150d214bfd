#!/usr/bin/env bash
# Fetch Debian's linux-source-7.3 (trixie-backports) and extract its tarball
# into the cache. Prints the path of the extracted tree.
#   BASE=/path/to/tree-or-tarball overrides the package with another base.
. "$(dirname "$0")/lib.sh"

if [ -n "${BASE:-}" ]; then
	[ -e "$BASE" ] || die "BASE=$BASE does not exist"
	if [ -d "$BASE" ]; then
		[ -f "$BASE/Makefile" ] && [ -d "$BASE/drivers/infiniband" ] || die "BASE=$BASE is not a kernel tree"
		realpath "$BASE"
		exit 0
	fi
	dir=$CACHE/base/custom-$(printf '%s' "$(realpath "$BASE")" | key_of)
	if [ ! -f "$dir/.extracted" ]; then
		rm -rf "$dir" && mkdir -p "$dir"
		tar -xf "$BASE" -C "$dir" --strip-components=1 || die "cannot extract BASE=$BASE"
		touch "$dir/.extracted"
	fi
	printf '%s\n' "$dir"
	exit 0
fi

dir=$CACHE/base/$BASE_PKG-$BASE_VERSION
if [ ! -f "$dir/.extracted" ]; then
	apt_private_update
	avail=$(apt-cache "${APT_OPTS[@]}" madison "$BASE_PKG" | awk '{ print $3 }' | sort -urV)
	[ -n "$avail" ] || die "package $BASE_PKG not found: the trixie-backports suite is missing from the mirror"
	if ! grep -qxF "$BASE_VERSION" <<<"$avail"; then
		die "$BASE_PKG $BASE_VERSION is not in the archive, which has: $(echo $avail).
Try BASE_VERSION=<one of those> (the tested version is 7.3.4-1~bpo13+1)."
	fi
	newest=$(head -1 <<<"$avail")
	[ "$newest" = "$BASE_VERSION" ] || log "note: the archive also has $BASE_PKG $newest (untested; BASE_VERSION=$newest to try it)"
	rm -rf "$dir" && mkdir -p "$dir"
	(cd "$dir" && apt-get "${APT_OPTS[@]}" download "$BASE_PKG=$BASE_VERSION" >/dev/null 2>&1) ||
		die "download of $BASE_PKG=$BASE_VERSION failed"
	deb=$(ls "$dir"/*.deb)
	extract() {
		dpkg-deb --fsys-tarfile "$deb" | tar -xO --wildcards './usr/src/linux-source-*.tar.xz' |
			tar -xJ -C "$dir" --strip-components=1
	}
	files_so_far() { echo "$(find "$dir" -type f | wc -l) files extracted"; }
	log "base: extracting $(basename "$deb")"
	run_with_progress "base: extract" "$dir.extract.log" files_so_far extract || die "cannot extract $deb"
	rm -f "$deb"
	touch "$dir/.extracted"
fi
printf '%s\n' "$dir"
