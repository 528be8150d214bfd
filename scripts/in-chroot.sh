#!/usr/bin/env bash
# Run a command in a chroot of the guest root filesystem, so guest userspace
# links against the guest's libraries. The repo is at /odpwatch, the output
# directory at /out and the kernel tree (if built) at /kernel/src and
# /kernel/build.
#   in-chroot.sh ROOTFS [KSRC KBUILD] -- CMD...
# The bind mounts live in a private mount namespace of this command: they die
# with it however it ends (SIGKILL included), so no later rm -rf of the root
# filesystem can reach the repository, out/ or the host's /dev through them.
. "$(dirname "$0")/lib.sh"

if [ "${ODPWATCH_IN_CHROOT_NS:-}" != $$ ]; then
	command -v unshare >/dev/null || die "unshare (util-linux) is missing"
	# exec: the namespace's first process is this script itself, so its
	# PID (and the marker) stay the same inside.
	ODPWATCH_IN_CHROOT_NS=$$ exec unshare --mount --propagation private -- "$0" "$@"
fi

root=$1
shift
ksrc="" kbuild=""
if [ "$1" != -- ]; then ksrc=$1 kbuild=$2; shift 2; fi
[ "$1" = -- ] && shift
bind() { mkdir -p "$root/$2" && mount --bind "$1" "$root/$2"; }
mount -t proc proc "$root/proc"
bind /dev dev
bind "$TOP" odpwatch
bind "$OUT" out
if [ -n "$ksrc" ]; then bind "$ksrc" kernel/src; bind "$kbuild" kernel/build; fi
chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/tmp LANG=C.UTF-8 "$@"
