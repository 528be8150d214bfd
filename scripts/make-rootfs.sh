#!/usr/bin/env bash
# Make (or reuse) the guest root filesystem: Debian trixie minbase with the
# packages of configs/guest-packages.list (debootstrap), then those of
# configs/guest-packages-apt.list (apt-get in the new root). Cached outside
# the repo, keyed by both lists and this script. Prints its path.
. "$(dirname "$0")/lib.sh"

list=$TOP/configs/guest-packages.list
apt_list=$TOP/configs/guest-packages-apt.list
stub=$TOP/scripts/guest/odpwatch-init
key=$(key_of "$list" "$apt_list" "$0" "$stub")
dir=$CACHE/rootfs/$GUEST_SUITE-$key
if [ -f "$dir/.odpwatch-ready" ]; then
	printf '%s\n' "$dir"
	exit 0
fi
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap missing: run scripts/install-host-deps.sh"
[ -f /usr/share/debootstrap/scripts/$GUEST_SUITE ] || die "this debootstrap does not know $GUEST_SUITE"
pkgs=$(grep -v '^#' "$list" | grep . | paste -sd, -)
mirror=$(debian_mirror)
remove_stale_tmp "$CACHE/rootfs"
tmp=$dir.tmp.$$
trap 'remove_tree "$tmp"' EXIT
log "rootfs: debootstrap $GUEST_SUITE minbase with $(tr ',' '\n' <<<"$pkgs" | wc -l) packages (once per package list)"
if ! run_with_progress "rootfs: debootstrap" "$CACHE/debootstrap.log" last_line \
	unshare --mount --propagation private debootstrap --variant=minbase --include="$pkgs" "$GUEST_SUITE" "$tmp" "$mirror"; then
	tail -20 "$CACHE/debootstrap.log" >&2
	die "debootstrap failed (a package missing from $GUEST_SUITE?); log: $CACHE/debootstrap.log"
fi
extra=$(grep -v '^#' "$apt_list" | grep . | paste -sd' ')
if [ -n "$extra" ]; then
	log "rootfs: apt-get install $(wc -w <<<"$extra") packages into it"
	# No service may start in the new root while packages are configured.
	printf '#!/bin/sh\nexit 101\n' >"$tmp/usr/sbin/policy-rc.d"
	chmod 0755 "$tmp/usr/sbin/policy-rc.d"
	# shellcheck disable=SC2016 # expanded by the inner shell
	if ! run_with_progress "rootfs: apt-get" "$CACHE/rootfs-apt.log" last_line \
		unshare --mount --propagation private sh -c 'mount -t proc proc "$1/proc" &&
			chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get -q update &&
			chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get -q -y --no-install-recommends install $2' \
		sh "$tmp" "$extra"; then
		tail -20 "$CACHE/rootfs-apt.log" >&2
		die "apt-get install in the root filesystem failed; log: $CACHE/rootfs-apt.log"
	fi
	rm -f "$tmp/usr/sbin/policy-rc.d"
	rm -rf "$tmp"/var/lib/apt/lists/*_Packages* "$tmp"/var/lib/apt/lists/*_InRelease
fi
install -m 0755 "$stub" "$tmp/sbin/odpwatch-init"
# mpirun and mpiexec start their remote daemons over ssh: a key pair for
# root, authorized for root, made once per root filesystem (which both
# cluster nodes share; the wire between them reaches nothing else).
if [ -x "$tmp/usr/sbin/sshd" ]; then
	install -d -m 0700 "$tmp/root/.ssh"
	chroot "$tmp" ssh-keygen -q -t ed25519 -N '' -C odpwatch-cluster -f /root/.ssh/id_ed25519
	cp "$tmp/root/.ssh/id_ed25519.pub" "$tmp/root/.ssh/authorized_keys"
	printf 'Host *\n\tStrictHostKeyChecking no\n\tUserKnownHostsFile /dev/null\n\tLogLevel ERROR\n' \
		>"$tmp/root/.ssh/config"
	# No PAM session in a guest without logind; keys only.
	printf 'UsePAM no\nPasswordAuthentication no\n' >"$tmp/etc/ssh/sshd_config.d/odpwatch.conf"
fi
mkdir -p "$tmp/odpwatch" "$tmp/out"
echo odpwatch >"$tmp/etc/hostname"
rm -rf "$tmp"/var/cache/apt/archives/*.deb
# Drop older rootfs generations: they are keyed by lists that no longer exist.
mapfile -t old < <(find "$CACHE/rootfs" -mindepth 1 -maxdepth 1 -name "$GUEST_SUITE-*" ! -name "*.tmp.*")
remove_tree ${old[@]+"${old[@]}"}
touch "$tmp/.odpwatch-ready"
mv "$tmp" "$dir"
trap - EXIT
printf '%s\n' "$dir"
