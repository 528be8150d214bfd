#!/usr/bin/env bash
# Build our rdma-core: Debian's rdma-core source with the series of
# other-projects/rdma-core/ applied by git am, built in a chroot of the guest
# root filesystem with Debian's own configuration, then installed over a
# copy of that root filesystem, in place of Debian's packages' files.
# Prints the path of that root filesystem (the base one stays untouched:
# the guest reaches it at /stock to run Debian's own rdma-core beside ours).
#   other-projects/rdma-core/build.sh ROOTFS
# Cached by the series, the base rootfs and this script: an unchanged series
# costs nothing; a changed one rebuilds incrementally in $OUT/rdma-core.
. "$(dirname "$0")/../../scripts/lib.sh"

rootfs=$1
series_dir=$TOP/other-projects/rdma-core
patches=("$series_dir"/*.patch)
key=$(key_of "${patches[@]}" "$0" <(basename "$rootfs"))
root=$CACHE/rootfs/$(basename "$rootfs")+rdma-core-$key
if [ -f "$root/.odpwatch-ready" ]; then
	printf '%s\n' "$root"
	exit 0
fi

base=$("$TOP/other-projects/rdma-core/fetch.sh")
src=$OUT/rdma-core/src build=$OUT/rdma-core/build dest=$OUT/rdma-core/root
mkdir -p "$OUT/rdma-core"
# Same source files with unchanged contents keep their timestamps: git
# checkout only rewrites what differs, so ninja rebuilds only that.
scratch_at_base "$base" "$src" odpwatch
git -C "$src" -c user.name=odpwatch -c user.email=odpwatch@localhost am -q "${patches[@]}" ||
	die "the rdma-core series does not apply to rdma-core $RDMA_CORE_VERSION with git am"
log "rdma-core: $RDMA_CORE_VERSION + ${#patches[@]} patches, building in the chroot"

# debian/rules' configuration, so every file lands where Debian's does. Man
# pages are not built: that needs pandoc and rst2man (Debian's tarball has no
# prebuilt copies); make lint checks ours with groff on the host.
run() { "$TOP/scripts/in-chroot.sh" "$rootfs" -- "$@"; }
build() {
	run_with_progress "rdma-core: build" "$OUT/rdma-core/build.log" ninja_step run sh -c 'set -e
	cmake -S /out/rdma-core/src -B /out/rdma-core/build -GNinja -Wno-dev \
		-DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
		-DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu \
		-DCMAKE_INSTALL_SYSCONFDIR=/etc -DCMAKE_INSTALL_LOCALSTATEDIR=/var \
		-DCMAKE_INSTALL_LIBEXECDIR=/usr/lib -DCMAKE_INSTALL_SHAREDSTATEDIR=/var/lib \
		-DCMAKE_INSTALL_RUNDIR=/run -DCMAKE_INSTALL_UDEV_RULESDIR=/usr/lib/udev/rules.d \
		-DCMAKE_INSTALL_SYSTEMD_SERVICEDIR=/usr/lib/systemd/system \
		-DCMAKE_INSTALL_INITDDIR=/etc/init.d -DCMAKE_INSTALL_PERLDIR=/usr/share/perl5 \
		-DNO_MAN_PAGES=1 -DPYTHON_EXECUTABLE=/usr/bin/python3 \
		-DCMAKE_INSTALL_PYTHON_ARCH_LIB=/usr/lib/python3/dist-packages >/dev/null
	ninja -C /out/rdma-core/build -j'"$(nproc)"'
	rm -rf /out/rdma-core/root
	DESTDIR=/out/rdma-core/root ninja -C /out/rdma-core/build install >/dev/null'
}
# An incremental build can fail where a series change removed a file that
# generated sources still include (pyverbs' Cython output): then once more
# from an empty build directory.
if ! build; then
	tail -5 "$OUT/rdma-core/build.log" >&2
	log "rdma-core: the incremental build failed; building again from scratch"
	rm -rf "$build"
	build || { tail -30 "$OUT/rdma-core/build.log" >&2; die "rdma-core build failed; log: $OUT/rdma-core/build.log"; }
fi
log "rdma-core: built ($(grep -c '^\[' "$OUT/rdma-core/build.log") build steps), installed into $dest"

# A hard-linked copy of the base rootfs; rsync replaces a file by renaming a
# new one over it, so the base's inodes are never written.
remove_stale_tmp "$CACHE/rootfs"
tmp=$root.tmp.$$
trap 'remove_tree "$tmp"' EXIT
cp -al "$rootfs" "$tmp"
rm -f "$tmp/.odpwatch-ready"
mkdir "$tmp/stock"
rsync -a "$dest/" "$tmp/"
# Debian compresses the test suite's sources; ours replace them uncompressed.
find "$tmp/usr/share/doc/rdma-core/tests" -name '*.py.gz' -delete
# Older generations are keyed by series that no longer exist.
mapfile -t old < <(find "$CACHE/rootfs" -mindepth 1 -maxdepth 1 -name "$(basename "$rootfs")+rdma-core-*" ! -name "*.tmp.*")
remove_tree ${old[@]+"${old[@]}"}
touch "$tmp/.odpwatch-ready"
mv "$tmp" "$root"
trap - EXIT
printf '%s\n' "$root"
