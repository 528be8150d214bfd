#!/usr/bin/env bash
# Build libfabric the way upstream does (autogen.sh, configure, make) from
# Debian's orig tarball with our series applied (other-projects/libfabric/: the
# memwatch memory monitor), in a chroot of the guest root filesystem, against
# the built kernel's uAPI headers; and, from the same tree, the fabtests of
# the MR cache. Installs into $OUT/guest/libfabric, the guest's
# /out/guest/libfabric, beside Debian's libfabric (which stays the system's:
# a program gets ours with LD_LIBRARY_PATH=/out/guest/libfabric/lib).
#   other-projects/libfabric/build.sh ROOTFS KSRC KBUILD
# Cached by the series, the root filesystem, the kernel's memwatch uAPI and
# this script; a changed series rebuilds in $OUT/libfabric.
. "$(dirname "$0")/../../scripts/lib.sh"

rootfs=$1 ksrc=$2 kbuild=$3
patches=("$TOP"/other-projects/libfabric/*.patch)
uapi=$kbuild/usr/include
key=$(key_of "${patches[@]}" "$0" <(basename "$rootfs") "$uapi/linux/memwatch.h" "$uapi/asm/unistd_64.h")
cached=$CACHE/libfabric/install-$key
dest=$OUT/guest/libfabric
fabtests="unit/fi_mr_cache_evict functional/fi_unmap_mem"

if [ ! -f "$cached/.odpwatch-ready" ]; then
	base=$("$TOP/other-projects/libfabric/fetch.sh")
	src=$OUT/libfabric/src
	mkdir -p "$OUT/libfabric"
	scratch_at_base "$base" "$src" odpwatch
	git -C "$src" -c user.name=odpwatch -c user.email=odpwatch@localhost am -q "${patches[@]}" ||
		die "the libfabric series does not apply to libfabric $LIBFABRIC_VERSION with git am"
	log "libfabric: $LIBFABRIC_VERSION + ${#patches[@]} patches, building in the chroot (verbs, rxm, tcp)"
	rm -rf "$dest"
	run() { "$TOP/scripts/in-chroot.sh" "$rootfs" "$ksrc" "$kbuild" -- "$@"; }
	# Only the providers the tests use. The kernel's uAPI headers come
	# first: they have <linux/memwatch.h> and __NR_memwatch_create.
	run_with_progress "libfabric: build" "$OUT/libfabric/build.log" last_line run sh -c 'set -e
		cd /out/libfabric/src
		./autogen.sh
		./configure --prefix=/out/guest/libfabric --disable-static \
			--enable-only --enable-verbs=yes --enable-rxm=yes --enable-tcp=yes \
			CPPFLAGS="-isystem /kernel/build/usr/include"
		grep -q "define HAVE_MEMWATCH_MONITOR 1" config.h
		make -j'"$(nproc)"'
		make install
		cd fabtests
		./autogen.sh
		./configure --prefix=/out/guest/libfabric --with-libfabric=/out/guest/libfabric
		make -j'"$(nproc)"' '"$fabtests"'
		install -m 755 '"$fabtests"' /out/guest/libfabric/bin/' ||
		{ tail -30 "$OUT/libfabric/build.log" >&2; die "libfabric build failed; log: $OUT/libfabric/build.log"; }
	remove_stale_tmp "$CACHE/libfabric"
	tmp=$cached.tmp.$$
	rm -rf "$tmp" && cp -a "$dest" "$tmp"
	# Older builds are keyed by series that no longer exist.
	find "$CACHE/libfabric" -mindepth 1 -maxdepth 1 -name 'install-*' ! -name '*.tmp.*' -exec rm -rf {} +
	touch "$tmp/.odpwatch-ready"
	mv "$tmp" "$cached"
fi
rsync -a --delete --exclude=.odpwatch-ready "$cached/" "$dest/"
log "libfabric: $dest ($(ls "$dest/bin" | wc -l) programs; memwatch monitor built in)"
