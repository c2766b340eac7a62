#!/usr/bin/env bash
# Checks the README's build path on a pristine Debian 12: a debootstrap'ed
# bookworm chroot with only the stated prerequisites (git, make), where
# `scripts/install-deps.sh --build` installs Debian's nodejs, npm and
# golang-go (1.19), fetches the Go toolchain go.mod asks for from the
# module proxy, and `make build` builds the console (Debian's Node 18,
# vite) and the static binaries. The runtime side of a stock Debian 12 is
# tested in the QEMU guest (test/guest).
#
# The pristine tree is built once into ${MOAT_CACHE:-/var/cache/moat}/
# debian-build/<key>/root (key hashes the suite and packages) and copied for each
# check, so every check starts from the same clean tree. The checkout is
# copied in as `git ls-files` lists it (committed or not).
#
# Usage (root): scripts/check-debian-build.sh   (make check-debian-build)
set -euo pipefail

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SELF=${BASH_SOURCE[0]}
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
INCLUDE=git,make,ca-certificates
# The key names the pristine tree's recipe (suite and packages).
KEY=$(echo "$SUITE $INCLUDE" | sha256sum | cut -c1-12)
CACHE=${MOAT_CACHE:-/var/cache/moat}/debian-build/$KEY

log() { echo "check-debian-build: $*" >&2; }

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [[ ! -e $CACHE/root/.done ]]; then
	command -v debootstrap >/dev/null || {
		log "installing debootstrap"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
	}
	rm -rf "$CACHE/root" "$CACHE/root.tmp"
	log "debootstrap $SUITE (a few minutes, once)"
	debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$CACHE/root.tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
		tail -30 "$CACHE/debootstrap.log" >&2
		exit 1
	}
	cat >"$CACHE/root.tmp/etc/apt/sources.list" <<-EOF
		deb $MIRROR $SUITE main
		deb $MIRROR $SUITE-updates main
		deb $SECURITY $SUITE-security main
	EOF
	chroot "$CACHE/root.tmp" apt-get clean
	touch "$CACHE/root.tmp/.done"
	mv "$CACHE/root.tmp" "$CACHE/root"
fi

work=$(mktemp -d "$CACHE/.check-XXXXXX")
root=$work/root
cleanup() {
	for m in dev/pts dev proc sys; do umount -l "$root/$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
cp -a "$CACHE/root" "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The machine's own extra CAs, where its network needs them (a proxy that
# re-signs TLS): what an administrator adds to any fresh install there.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
	chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
mkdir -p "$root/src/moat"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -a -t "$root/src/moat" 2>/dev/null) || true

start=$SECONDS
# The chroot's own environment: no Go, Node or caches of the host.
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	LANG=C.UTF-8 MOAT_CACHE=/var/cache/moat bash -euo pipefail -c '
	cd /src/moat
	bash scripts/install-deps.sh --build
	echo "check-debian-build: node $(node --version), npm $(npm --version), $(dpkg-query -W -f="golang-go \${Version}" golang-go), $(/usr/local/go/bin/go version)"
	make build
	./bin/moat version
	test -s internal/console/dist/app/index.html
'
log "make build on a pristine Debian 12 passed ($((SECONDS - start)) s)"
