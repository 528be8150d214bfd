#!/usr/bin/env bash
# Run a command in a chroot of the guest root filesystem, so guest userspace
# links against the guest's libraries. The repo is at /odpwatch, the output
# directory at /out and the kernel tree (if built) at /kernel/src and
# /kernel/build.
#   in-chroot.sh ROOTFS [KSRC KBUILD] -- CMD...
. "$(dirname "$0")/lib.sh"

root=$1
shift
ksrc="" kbuild=""
if [ "$1" != -- ]; then ksrc=$1 kbuild=$2; shift 2; fi
[ "$1" = -- ] && shift
mounts=()
cleanup() { for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done; }
trap cleanup EXIT
bind() { mkdir -p "$root/$2" && mount --bind "$1" "$root/$2" && mounts+=("$root/$2"); }
mount -t proc proc "$root/proc" && mounts+=("$root/proc")
bind /dev dev
bind "$TOP" odpwatch
bind "$OUT" out
if [ -n "$ksrc" ]; then bind "$ksrc" kernel/src; bind "$kbuild" kernel/build; fi
chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/tmp LANG=C.UTF-8 "$@"
