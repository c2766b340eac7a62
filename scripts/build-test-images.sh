#!/usr/bin/env bash
# Builds the test images that busybox cannot provide, from the Debian
# mirror (debootstrap), cached by suite and package list so reruns are
# instant. No container registry is involved.
#
#   debian-ipykernel: Debian minbase + python3-ipykernel, for the agent's
#   Jupyter backend inside a real sandbox (test/e2e TestJupyterInSandbox).
#
# Output: ${MOAT_CACHE:-/var/cache/moat}/images/<name>-<key>.tar.gz
set -euo pipefail

CACHE=${MOAT_CACHE:-/var/cache/moat}/images
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PKGS=python3-ipykernel
KEY=$(printf '%s %s' "$SUITE" "$PKGS" | sha256sum | cut -c1-12)
OUT=$CACHE/debian-ipykernel-$KEY.tar.gz

if [[ -s $OUT ]]; then
	echo "$OUT"
	exit 0
fi
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
mkdir -p "$CACHE"
work=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'umount -R "$work/root" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "build-test-images: debootstrap $SUITE + $PKGS (a few minutes, once)" >&2
debootstrap --variant=minbase "$SUITE" "$work/root" "$MIRROR" >"$work/log" 2>&1 || {
	tail -20 "$work/log" >&2
	exit 1
}
# debootstrap's own --include resolver pulls recommends and fails on
# this set; apt inside the new root resolves it properly.
mount -t proc proc "$work/root/proc"
chroot "$work/root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS >>"$work/log" 2>&1 || {
	tail -20 "$work/log" >&2
	exit 1
}
chroot "$work/root" apt-get clean
umount "$work/root/proc"
# Drop what a sandbox does not need (apt lists and caches, docs).
rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/* "$work/root"/usr/share/doc "$work/root"/usr/share/man
tar -C "$work/root" --numeric-owner -czf "$work/img.tar.gz" .
mv "$work/img.tar.gz" "$OUT"
echo "$OUT"
