#!/usr/bin/env bash
# Fetch Debian's rdma-core source (trixie), apply Debian's own quilt patches
# and import the result as a git tree whose one commit is tagged
# odpwatch-base: the base our rdma-core series (other-projects/rdma-core/)
# applies to with git am. Prints the tree's path.
. "$(dirname "$0")/../../scripts/lib.sh"

dir=$CACHE/rdma-core/base-$RDMA_CORE_VERSION
if [ ! -f "$dir/.imported" ]; then
	apt_private_update
	rm -rf "$dir" "$dir.dl" && mkdir -p "$dir" "$dir.dl"
	# The archive may lack the .dsc (apt then fails after fetching the
	# tarballs); the tarballs are checked against the signed index anyway.
	(cd "$dir.dl" && apt-get "${APT_OPTS[@]}" source --download-only "rdma-core=$RDMA_CORE_VERSION" >/dev/null 2>&1) || true
	upstream=${RDMA_CORE_VERSION%-*}
	orig=$dir.dl/rdma-core_$upstream.orig.tar.gz deb=$dir.dl/rdma-core_$RDMA_CORE_VERSION.debian.tar.xz
	[ -f "$orig" ] && [ -f "$deb" ] || die "download of rdma-core $RDMA_CORE_VERSION source failed (trixie deb-src on the mirror?)"
	tar -xzf "$orig" -C "$dir" --strip-components=1
	tar -xJf "$deb" -C "$dir"
	if [ -f "$dir/debian/patches/series" ]; then
		while read -r p; do
			case $p in '' | '#'*) continue ;; esac
			patch -s -p1 -d "$dir" <"$dir/debian/patches/$p" || die "Debian patch $p does not apply"
		done <"$dir/debian/patches/series"
	fi
	git -C "$dir" init -q
	git -C "$dir" add -A
	git -C "$dir" -c user.name=odpwatch -c user.email=odpwatch@localhost \
		commit -q -m "rdma-core $RDMA_CORE_VERSION (Debian source, Debian patches applied)"
	git -C "$dir" tag odpwatch-base
	rm -rf "$dir.dl"
	touch "$dir/.imported"
fi
printf '%s\n' "$dir"
