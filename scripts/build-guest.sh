#!/usr/bin/env bash
# Builds the stock Debian 12 guest the guest tests boot under QEMU (software
# emulation, no KVM): a host with cgroup v2 unified under systemd and
# Debian's 6.1 kernel, which the CI machine (cgroup v1, another kernel)
# cannot be turned into. Everything comes from Debian's packages:
#
#   vmlinuz, initrd.img  the stock kernel (linux-image-amd64) and its initrd,
#                        installed into the guest root only, never on the host
#   disk.img             a raw ext4 disk (mkfs.ext4 -d, no loop mount) of a
#                        debootstrap'ed bookworm with systemd, runc, crun,
#                        nftables, iproute2 and busybox-static
#
# The guest has no ssh: a small service (moat-guest-agent, below) runs the
# shell scripts the host drops into the virtio-9p share "host0" and writes
# back their output and exit code (internal/testutil/guest drives it). Its
# only network is QEMU's user-mode net with restrict=on: no route out, the
# host reaches it through loopback port forwards.
#
# Output in ${MOAT_CACHE:-/var/cache/moat}/guest/<key>/, where key hashes
# this script (the recipe); built once, then instant; one builder at a time.
#
# Usage: scripts/build-guest.sh [--print-dir]
set -euo pipefail

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
PKGS="systemd systemd-sysv udev kmod linux-image-amd64 runc crun nftables iproute2 busybox-static procps"
SELF=${BASH_SOURCE[0]}
KEY=$(sha256sum "$SELF" | cut -c1-12)
OUT=${MOAT_CACHE:-/var/cache/moat}/guest/$KEY

if [[ ${1:-} == --print-dir ]]; then
	echo "$OUT"
	exit 0
fi

log() { echo "build-guest: $*" >&2; }
done_() { [[ -s $OUT/disk.img && -s $OUT/vmlinuz && -s $OUT/initrd.img ]]; }

if done_; then
	exit 0
fi
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if done_; then
	exit 0
fi
missing=()
for c in debootstrap:debootstrap qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils; do
	command -v "${c%%:*}" >/dev/null || missing+=("${c#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then
	log "installing ${missing[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$(mktemp -d "$OUT/.build-XXXXXX")
root=$work/root
trap 'umount -R "$root/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
fail() {
	tail -30 "$work/log" >&2
	log "failed (log above)"
	exit 1
}
start=$SECONDS
log "debootstrap $SUITE (a few minutes, once)"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" >"$work/log" 2>&1 || fail
cat >"$root/etc/apt/sources.list" <<-EOF
	deb $MIRROR $SUITE main
	deb $MIRROR $SUITE-updates main
	deb $SECURITY $SUITE-security main
EOF
# The kernel's postinst builds the initrd (initramfs-tools, MODULES=most:
# virtio and ext4 included) inside the guest root.
mount -t proc proc "$root/proc"
log "installing $PKGS"
{
	chroot "$root" apt-get update -q &&
		chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS
} >>"$work/log" 2>&1 || fail
chroot "$root" apt-get clean
umount "$root/proc"

# Configuration: root on the virtio disk, a static address on QEMU's
# user-mode net, no timers or services a test does not need.
echo "/dev/vda / ext4 rw,errors=remount-ro 0 1" >"$root/etc/fstab"
echo moat-guest >"$root/etc/hostname"
mkdir -p "$root/etc/systemd/network" "$root/mnt/host"
cat >"$root/etc/systemd/network/10-user.network" <<-'EOF'
	[Match]
	Name=en* eth*
	[Network]
	Address=10.0.2.15/24
	Gateway=10.0.2.2
EOF
chroot "$root" systemctl enable systemd-networkd.service >>"$work/log" 2>&1 || fail
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
	systemd-networkd-wait-online.service getty@tty1.service; do
	ln -sf /dev/null "$root/etc/systemd/system/$u"
done

# The command channel: the host writes cmd/ID.sh (by rename, so it is
# complete); the agent renames it to ID.run, runs it as root and writes
# ID.out, ID.err and, last, ID.rc. "ready" tells the host it is listening.
cat >"$root/usr/local/sbin/moat-guest-agent" <<-'EOF'
	#!/bin/bash
	set -u
	dir=/mnt/host/cmd
	mkdir -p "$dir"
	uname -r >/mnt/host/.ready && mv /mnt/host/.ready /mnt/host/ready
	while :; do
		for f in "$dir"/*.sh; do
			[ -e "$f" ] || continue
			id=${f%.sh}
			mv "$f" "$id.run" || continue
			(
				cd /root
				bash "$id.run" >"$id.out" 2>"$id.err" </dev/null
				echo $? >"$id.rc.tmp" && mv "$id.rc.tmp" "$id.rc"
			) &
		done
		sleep 0.1
	done
EOF
chmod 0755 "$root/usr/local/sbin/moat-guest-agent"
cat >"$root/etc/systemd/system/moat-guest-agent.service" <<-'EOF'
	[Unit]
	Description=Runs the host's commands from the 9p share
	After=local-fs.target
	[Service]
	Environment=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
	ExecStartPre=/sbin/modprobe -a 9pnet_virtio 9p
	ExecStartPre=/bin/mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 host0 /mnt/host
	ExecStart=/usr/local/sbin/moat-guest-agent
	KillMode=process
	[Install]
	WantedBy=multi-user.target
EOF
chroot "$root" systemctl enable moat-guest-agent.service >>"$work/log" 2>&1 || fail

cp -L "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp -L "$root"/boot/initrd.img-* "$work/initrd.img"
# Drop what the guest never loads or reads (the initrd is made already).
rm -rf "$root"/boot/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man \
	"$root"/usr/share/locale/* "$root"/lib/modules/*/kernel/{sound,drivers/gpu,drivers/media,drivers/net/wireless,drivers/infiniband,drivers/staging}
# Room for the images and sandboxes of a test run; the disk is sparse, and
# each boot writes to its own qcow2 overlay.
size=$(($(du -sm "$root" | cut -f1) + 2048))
truncate -s "${size}M" "$work/disk.img"
mkfs.ext4 -q -F -L moat-guest -d "$root" "$work/disk.img" >>"$work/log" 2>&1 || fail
mv "$work/vmlinuz" "$work/initrd.img" "$OUT/"
mv "$work/disk.img" "$OUT/disk.img"
log "built $OUT in $((SECONDS - start)) s"
