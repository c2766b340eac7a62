#!/usr/bin/env bash
# Builds the test images that busybox cannot provide, from the Debian
# mirror (debootstrap) and, for tslab, the npm registry (a locked
# package-lock.json), cached by suite, package list and lockfile so reruns
# are instant. No container registry is involved.
#
#   build-test-images.sh [e2b-base | debian-kernels | e2b-code-interpreter]
#     e2b-base: an image like E2B's base template (the E2B SDK suite,
#     test/compat/e2b): bash, python3, node, git, sudo, and the account
#     `user` (uid 1000, home /home/user, sudo without a password).
#     debian-kernels (alias e2b-code-interpreter): e2b-base plus every
#     code-context backend, made from the e2b-base tarball rather than a
#     second debootstrap (test/e2e TestJupyterInSandbox,
#     TestCodeLanguagesInSandbox, the JS SDK code-context suite
#     TestCompatJSCodeContexts, and the E2B code-interpreter suite):
#     Jupyter kernels for python (python3-ipykernel), R (r-cran-irkernel)
#     and TypeScript (tslab, npm, scripts/testimages/tslab), and the
#     runtimes of the agent's built-in drivers: a JDK (jshell) for Java,
#     node for JavaScript, node-typescript for TypeScript without tslab.
#     No Go kernel is served by Debian, npm or the Go module proxy here.
#
# Output (stdout): ${MOAT_CACHE:-/var/cache/moat}/images/<name>-<key>.tar.gz
set -euo pipefail

NAME=${1:-debian-kernels}
CACHE=${MOAT_CACHE:-/var/cache/moat}/images
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TSLAB=
BASE= # the image this one is made from (its tarball, unpacked)
case $NAME in
e2b-base)
	PKGS="bash python3 nodejs git sudo ca-certificates procps"
	;;
debian-kernels | e2b-code-interpreter)
	NAME=debian-kernels
	BASE=e2b-base
	PKGS="python3-ipykernel r-cran-irkernel default-jdk-headless nodejs node-typescript"
	TSLAB=$HERE/testimages/tslab
	;;
*)
	echo "build-test-images: unknown image $NAME (e2b-base, debian-kernels, e2b-code-interpreter)" >&2
	exit 2
	;;
esac
BASE_TAR=
if [[ -n $BASE ]]; then
	BASE_TAR=$(bash "${BASH_SOURCE[0]}" "$BASE")
fi
LAYOUT=3 # bump when the build steps change what an image holds
KEY=$({
	printf '%s %s' "$SUITE" "$PKGS"
	echo "layout $LAYOUT"
	echo "base $(basename "${BASE_TAR:-none}")"
	[[ -z $TSLAB ]] || cat "$TSLAB/package-lock.json"
} | sha256sum | cut -c1-12)
OUT=$CACHE/$NAME-$KEY.tar.gz

if [[ -s $OUT ]]; then
	echo "$OUT"
	exit 0
fi
mkdir -p "$CACHE"
# One build of an image at a time (tests may ask for it concurrently).
exec 9>"$CACHE/.$NAME.lock"
flock 9
if [[ -s $OUT ]]; then
	echo "$OUT"
	exit 0
fi
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
work=$(mktemp -d "$CACHE/.build-XXXXXX")
trap 'umount -R "$work/root" 2>/dev/null || true; rm -rf "$work"' EXIT
if [[ -z $BASE ]]; then
	echo "build-test-images: debootstrap $SUITE + $PKGS (a few minutes, once)" >&2
	debootstrap --variant=minbase "$SUITE" "$work/root" "$MIRROR" >"$work/log" 2>&1 || {
		tail -20 "$work/log" >&2
		exit 1
	}
else
	# Layered: the base image's tree plus packages (its apt lists were
	# dropped, so they are fetched again).
	echo "build-test-images: $BASE + $PKGS (a few minutes, once)" >&2
	mkdir "$work/root"
	tar -C "$work/root" -xzf "$BASE_TAR"
	chroot "$work/root" apt-get update -q >"$work/log" 2>&1 || {
		tail -20 "$work/log" >&2
		exit 1
	}
fi
# debootstrap's own --include resolver pulls recommends and fails on
# this set; apt inside the new root resolves it properly.
mount -t proc proc "$work/root/proc"
chroot "$work/root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PKGS >>"$work/log" 2>&1 || {
	tail -20 "$work/log" >&2
	exit 1
}
chroot "$work/root" apt-get clean
umount "$work/root/proc"

if [[ $NAME == e2b-base ]]; then
	# E2B's account: `user`, uid 1000, sudo without a password.
	chroot "$work/root" useradd --create-home --shell /bin/bash --uid 1000 --user-group user
	echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >"$work/root/etc/sudoers.d/user"
	chmod 0440 "$work/root/etc/sudoers.d/user"
fi

kernels=$work/root/usr/local/share/jupyter/kernels
if [[ $NAME == debian-kernels ]]; then
	# IRkernel: Debian ships the package, not a registered kernelspec.
	if ! ls "$work/root"/usr/share/jupyter/kernels/*/kernel.json 2>/dev/null | xargs -r grep -qil '"language": *"R"'; then
		mkdir -p "$kernels/ir"
		cat >"$kernels/ir/kernel.json" <<-'EOF'
			{"argv": ["/usr/bin/R", "--slave", "--no-save", "--no-restore", "-e", "IRkernel::main()", "--args", "{connection_file}"],
			 "display_name": "R", "language": "R"}
		EOF
	fi
	# tslab from its lockfile (npm ci on the host; its zeromq addon is
	# prebuilt inside the npm package), kernelspec for TypeScript only:
	# JavaScript stays on the agent's built-in node driver in this image.
	command -v npm >/dev/null || {
		echo "build-test-images: npm is needed for tslab (scripts/install-deps.sh)" >&2
		exit 1
	}
	mkdir -p "$work/tslab"
	cp "$TSLAB/package.json" "$TSLAB/package-lock.json" "$work/tslab/"
	(cd "$work/tslab" && npm ci --no-audit --no-fund --loglevel=error >>"$work/log" 2>&1) || {
		tail -20 "$work/log" >&2
		exit 1
	}
	# The layout of `npm install -g tslab`: tslab with its dependencies in
	# its own node_modules, where it looks for @types/node.
	mkdir -p "$work/root/opt/tslab/node_modules"
	cp -a "$work/tslab/node_modules/tslab/." "$work/root/opt/tslab/"
	for d in "$work/tslab/node_modules"/* "$work/tslab/node_modules"/.bin; do
		[[ $(basename "$d") == tslab ]] || cp -a "$d" "$work/root/opt/tslab/node_modules/"
	done
	mkdir -p "$kernels/tslab"
	cat >"$kernels/tslab/kernel.json" <<-'EOF'
		{"argv": ["/usr/bin/node", "/opt/tslab/bin/tslab", "kernel", "--config-path", "{connection_file}"],
		 "display_name": "TypeScript", "language": "typescript"}
	EOF
fi

# Drop what a sandbox does not need (apt lists and caches, docs,
# translations, the JDK's jmods, which only jlink reads).
rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/* "$work/root"/usr/share/doc \
	"$work/root"/usr/share/man "$work/root"/usr/share/locale/* "$work/root"/usr/lib/jvm/*/jmods
# Fast compression: the image is built once per machine and read locally.
tar -C "$work/root" --numeric-owner -I 'gzip -1' -cf "$work/img.tar.gz" .
mv "$work/img.tar.gz" "$OUT"
echo "$OUT"
