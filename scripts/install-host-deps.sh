#!/usr/bin/env bash
# Install what the host needs to build the kernel, make the guest root
# filesystem and run QEMU (and, for job bench, draw plots). Idempotent: skips apt when everything is there.
. "$(dirname "$0")/lib.sh"

PKGS=(build-essential bc bison flex libelf-dev libssl-dev cpio rsync xz-utils kmod
	dwarves python3 git ccache debootstrap qemu-system-x86 qemu-utils
	clang-format python3-ply python3-git groff-base python3-docutils)
# make bench draws its plots on the host.
[ "${1:-}" = bench ] && PKGS+=(python3-matplotlib)
missing=()
for p in "${PKGS[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	log "host packages: all ${#PKGS[@]} present"
	exit 0
fi
[ "$(id -u)" -eq 0 ] || die "need root to install: ${missing[*]}"
log "host packages: installing ${missing[*]}"
install() {
	apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}
mkdir -p "$OUT"
run_with_progress "host packages: apt" "$OUT/host-packages.log" last_line install "${missing[@]}" ||
	{ tail -20 "$OUT/host-packages.log" >&2; die "apt-get install failed; log: $OUT/host-packages.log"; }
