#!/usr/bin/env bash
# Build the guest's userspace in a chroot of its root filesystem, so it links
# against the guest's libraries: our kselftests (with the kernel's selftest
# framework and the built tree's uAPI headers) and libprovider.
# Results land in $OUT/guest (the guest sees it at /out/guest).
#   build-guest.sh ROOTFS KSRC KBUILD
. "$(dirname "$0")/lib.sh"

rootfs=$1 ksrc=$2 kbuild=$3
# Our kselftest targets: each directory of selftests/ (rdma is upstream's
# target, with our rxe ODP tests added to it).
selftests=$(cd "$TOP/selftests" && find . -mindepth 1 -maxdepth 1 -type d -printf '%P\n' | sort | paste -sd' ')
mkdir -p "$OUT/guest"
run() { "$TOP/scripts/in-chroot.sh" "$rootfs" "$ksrc" "$kbuild" -- "$@"; }

# HAVE_LIBIBVERBS=y: the rxe ODP tests are built for real or the build fails
# (never the stubs that skip where libibverbs is missing).
log "guest: kselftests ($selftests)"
rm -rf "$OUT/guest/selftests"
run_with_progress "guest: kselftests" "$OUT/guest/selftests-build.log" last_line \
	run make -s -C /kernel/src/tools/testing/selftests TARGETS="$selftests" HAVE_LIBIBVERBS=y \
	O=/out/guest/selftests-build KHDR_INCLUDES="-isystem /kernel/build/usr/include" \
	INSTALL_PATH=/out/guest/selftests install ||
	{ tail -30 "$OUT/guest/selftests-build.log" >&2; die "kselftest build failed; log: $OUT/guest/selftests-build.log"; }

# The base kernel's own mm and rdma kselftests, installed apart:
# configs/upstream-kselftests.list says which run (rdma's build brings our
# rxe_odp_* binaries along; the list leaves them to the selftests suite).
log "guest: upstream mm and rdma kselftests"
rm -rf "$OUT/guest/upstream-kselftests"
run_with_progress "guest: upstream mm and rdma kselftests" "$OUT/guest/upstream-kselftests-build.log" last_line \
	run make -s -j"$(nproc)" -C /kernel/src/tools/testing/selftests TARGETS="mm rdma" HAVE_LIBIBVERBS=y \
	O=/out/guest/upstream-kselftests-build KHDR_INCLUDES="-isystem /kernel/build/usr/include" \
	INSTALL_PATH=/out/guest/upstream-kselftests install ||
	{ tail -30 "$OUT/guest/upstream-kselftests-build.log" >&2; die "upstream mm and rdma kselftests do not build; log: $OUT/guest/upstream-kselftests-build.log"; }
# The kernel's built-in modules, for kmod in the guest (the rdma kselftests
# modprobe what they use).
run sh -c 'mkdir -p /out/guest/kernel-modules &&
	cp /kernel/build/modules.builtin /kernel/build/modules.builtin.modinfo /out/guest/kernel-modules/' ||
	die "no modules.builtin in the kernel build"
# mm's check_config.sh writes its results into the source tree, whatever O=
# says: the tree must stay the one the series yield (the series check).
rm -f "$ksrc/tools/testing/selftests/mm/local_config.h_gen" "$ksrc/tools/testing/selftests/mm/local_config.mk"

log "guest: libprovider (C++20)"
run_with_progress "guest: libprovider" "$OUT/guest/libprovider-build.log" cmake_percent \
	run sh -c 'cmake -S /odpwatch -B /out/guest/libprovider-build -DCMAKE_INSTALL_PREFIX=/out/guest \
		-DODPWATCH_KERNEL_HEADERS=/kernel/build/usr/include -DODPWATCH_TESTS=ON -DODPWATCH_WERROR=ON >/dev/null &&
	cmake --build /out/guest/libprovider-build -j'"$(nproc)"' &&
	cmake --install /out/guest/libprovider-build >/dev/null' ||
	{ tail -30 "$OUT/guest/libprovider-build.log" >&2; die "libprovider build failed; log: $OUT/guest/libprovider-build.log"; }

# As a distribution would build it: without the odpwatch kernel's headers and
# without the tests, installed under a staging root (pyverbs-tests/
# test_install.py checks its layout and that memwatch says EOPNOTSUPP).
log "guest: libprovider as a distribution builds it (no odpwatch headers, no tests)"
run_with_progress "guest: libprovider (distribution)" "$OUT/guest/distro-build.log" cmake_percent \
	run sh -c 'cmake -S /odpwatch -B /out/guest/distro-build -DCMAKE_INSTALL_PREFIX=/usr -DODPWATCH_WERROR=ON >/dev/null &&
	cmake --build /out/guest/distro-build -j'"$(nproc)"' &&
	rm -rf /out/guest/distro && DESTDIR=/out/guest/distro cmake --install /out/guest/distro-build >/dev/null' ||
	{ tail -30 "$OUT/guest/distro-build.log" >&2; die "libprovider does not build without the odpwatch headers; log: $OUT/guest/distro-build.log"; }

log "guest: MPI programs (middleware/mpi) for Open MPI and MPICH"
for mpi in openmpi mpich; do
	run sh -c "command -v mpicxx.$mpi >/dev/null" || die "mpicxx.$mpi missing from the root filesystem"
	run mpicxx.$mpi -std=c++20 -O2 -Wall -Wextra -Werror -I/odpwatch/libprovider/tests -I/odpwatch/libprovider/include -o /out/guest/bin/stale_send.$mpi \
		/odpwatch/middleware/mpi/stale_send.cpp >"$OUT/guest/stale_send.$mpi.log" 2>&1 ||
		{ cat "$OUT/guest/stale_send.$mpi.log" >&2; die "stale_send does not build with $mpi"; }
done
# The same program built with AddressSanitizer, whose allocator maps and
# unmaps memory with system calls of its own.
run mpicxx.openmpi -std=c++20 -O1 -g -fsanitize=address -Wall -Wextra -Werror -I/odpwatch/libprovider/tests -I/odpwatch/libprovider/include \
	-o /out/guest/bin/stale_send.asan.openmpi /odpwatch/middleware/mpi/stale_send.cpp \
	>"$OUT/guest/stale_send.asan.log" 2>&1 ||
	{ cat "$OUT/guest/stale_send.asan.log" >&2; die "stale_send does not build with AddressSanitizer"; }
# And in Go, whose runtime gives freed memory back with system calls of its
# own (cgo for MPI; the build cache under /out, so the cached root
# filesystem stays as it was built).
run sh -c 'export GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-buildvcs=false GOCACHE=/out/guest/go-cache CGO_ENABLED=1 \
	CGO_CFLAGS="$(mpicc.openmpi --showme:compile) -I/odpwatch/libprovider/include" \
	CGO_LDFLAGS="$(mpicc.openmpi --showme:link)" &&
	go build -o /out/guest/bin/stale_send_go.openmpi /odpwatch/middleware/mpi/go/stale_send.go &&
	go vet /odpwatch/middleware/mpi/go/stale_send.go &&
	{ unformatted=$(gofmt -l /odpwatch/middleware/mpi/go); [ -z "$unformatted" ] || { echo "not gofmt-ed: $unformatted"; false; }; }' \
	>"$OUT/guest/stale_send_go.log" 2>&1 ||
	{ cat "$OUT/guest/stale_send_go.log" >&2; die "stale_send_go does not build"; }

log "guest: man page examples"
rm -rf "$OUT/guest/man-examples"
python3 "$TOP/man/extract-examples.py" "$OUT/guest/man-examples" "$TOP"/man/man*/*.[0-9] >/dev/null
for c in "$OUT"/guest/man-examples/*.c; do
	[ -e "$c" ] || continue
	name=$(basename "$c" .c)
	# A library page's example builds as its users would: with pkg-config,
	# against the installed headers and library.
	libs=""
	grep -q '#include <odpwatch/' "$c" &&
		libs="\$(PKG_CONFIG_PATH=/out/guest/lib/pkgconfig pkg-config --cflags --libs odpwatch) -Wl,-rpath,/out/guest/lib"
	run sh -c "cc -Wall -Wextra -Werror -idirafter /kernel/build/usr/include \
		-o /out/guest/man-examples/$name /out/guest/man-examples/$name.c $libs" \
		>"$OUT/guest/man-examples/$name.log" 2>&1 ||
		{ cat "$OUT/guest/man-examples/$name.log" >&2; die "the example of $name does not build"; }
done
