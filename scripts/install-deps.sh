#!/usr/bin/env bash
# Installs the Debian packages moat needs to run and test (idempotent).
# Runs as root on Debian 12. Nothing is downloaded but Debian packages and
# Go modules.
set -euo pipefail

# cgroup_v2 ROOT: whether ROOT is a cgroup v2 filesystem (the unified
# hierarchy). statfs is the kernel's own answer (CGROUP2_SUPER_MAGIC prints
# as cgroup2fs); a v1 or hybrid host has a tmpfs there.
cgroup_v2() {
	[ "$(stat -f -c %T "$1" 2>/dev/null)" = cgroup2fs ]
}

# cgroup_v1_missing ROOT CGROUPS: the enabled controllers that no v1
# hierarchy holds (hierarchy 0 in /proc/cgroups), on a v1 or hybrid host
# only; nothing on a v2 host, whose layout set-up must never change. The
# file is read whole first: mounting changes it while it is read.
cgroup_v1_missing() {
	cgroup_v2 "$1" && return 0
	[ -d "$1" ] || return 0
	local lines line name hier enabled
	mapfile -t lines <"$2"
	for line in "${lines[@]}"; do
		read -r name hier _ enabled <<<"$line"
		[ "$name" = "#subsys_name" ] && continue
		[ "$enabled" = 1 ] && [ "$hier" = 0 ] && echo "$name"
	done
	return 0
}

cgroup_root=${MOAT_CGROUP_ROOT:-/sys/fs/cgroup}
cgroups_file=${MOAT_PROC_CGROUPS:-/proc/cgroups}

# --cgroup-plan: print the controllers set-up would mount, and nothing else
# (the tests run it against cgroup filesystems of their own).
if [ "${1:-}" = "--cgroup-plan" ]; then
	cgroup_v1_missing "$cgroup_root" "$cgroups_file"
	exit 0
fi

# --browser: only Debian's chromium (and a font), for the web console's
# browser test (test/e2e TestConsoleBrowser drives it with playwright-core;
# no browser is ever downloaded).
if [ "${1:-}" = "--browser" ]; then
	missing=()
	for p in chromium fonts-dejavu-core; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "install-deps: installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
	exit 0
fi

# --build: only what `make build` needs (node and npm for the console, the
# Go toolchain); scripts/check-debian-build.sh checks this path on a
# pristine Debian 12.
build_only=
[ "${1:-}" = "--build" ] && build_only=1

# stress-ng: the CPU hog the chaos test (test/e2e) runs under.
# python3-ipykernel: a real Jupyter kernel for the execd Jupyter backend tests;
# default-jdk-headless and node-typescript: the agent's built-in Java
# (jshell) and TypeScript drivers, tested on the host (internal/execd/code).
# debootstrap: scripts/build-test-images.sh, and with QEMU
# scripts/build-guest.sh (installed here so that no apt runs while
# `make test-setup` builds its stages at once).
# redis-server: the Go SDK pool's Redis state store (test/compat/go).
pkgs=(runc crun runsc busybox-static nftables iproute2 ca-certificates git make stress-ng python3-ipykernel default-jdk-headless node-typescript debootstrap qemu-system-x86 qemu-utils redis-server)
missing=()
[ -n "$build_only" ] && pkgs=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "install-deps: installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Node.js and npm drive the OpenSandbox JS SDK compatibility test
# (test/compat/js). Machines that already have a node (e.g. a newer one from
# another source) keep it; Debian 12's nodejs is 18 while the SDK wants 20.
if ! command -v node >/dev/null 2>&1; then
	echo "install-deps: installing nodejs npm"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
elif ! command -v npm >/dev/null 2>&1 && ! dpkg-query -W -f='${Status}' nodejs 2>/dev/null | grep -q nodesource; then
	echo "install-deps: installing npm"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends npm >/dev/null
fi

# The Go toolchain go.mod asks for, at /usr/local/go (the Makefile puts
# /usr/local/go/bin first on PATH). A machine without one gets Debian's
# golang-go (1.19), which only serves to fetch the toolchain module
# golang.org/toolchain from the module proxy (checked against the checksum
# database): Go 1.19 predates GOTOOLCHAIN, so it is unpacked here, into
# the cache, and linked as /usr/local/go. A /usr/local/go of our own
# making is moved on to a newer toolchain; any other one is left alone.
GO_VERSION=${GO_VERSION:-1.26.8} # at least go.mod's go line
ensure_go() {
	local here want have go dir tmp
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
	want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod")
	[ "$(printf '%s\n' "$want" "$GO_VERSION" | sort -V | tail -1)" = "$want" ] || want=$GO_VERSION
	go=/usr/local/go/bin/go
	[ -x "$go" ] || go=$(command -v go || true)
	have=$([ -n "$go" ] && "$go" env GOVERSION 2>/dev/null | sed 's/^go//' || true)
	if [ -n "$have" ] && [ "$(printf '%s\n' "$want" "$have" | sort -V | head -1)" = "$want" ]; then
		return 0
	fi
	if [ -e /usr/local/go ] && [ ! -L /usr/local/go ]; then
		echo "install-deps: /usr/local/go is Go $have; moat needs $want or newer (GOTOOLCHAIN=auto fetches it from Go 1.21 on)" >&2
		return 0
	fi
	if [ -z "$go" ]; then
		echo "install-deps: installing golang-go (to fetch Go $want)"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends golang-go >/dev/null
		go=$(command -v go)
	fi
	dir=${MOAT_CACHE:-/var/cache/moat}/go/go$want
	if [ ! -x "$dir/bin/go" ]; then
		echo "install-deps: fetching Go $want (golang.org/toolchain) from the module proxy"
		mkdir -p "$(dirname "$dir")"
		tmp=$(mktemp -d "$dir.tmp.XXXXXX")
		# An empty module directory, so that no go.mod around is read.
		(cd "$tmp" && GOFLAGS=-modcacherw GOMODCACHE="$tmp/mod" GO111MODULE=on GOTOOLCHAIN=local \
			"$go" mod download "golang.org/toolchain@v0.0.1-go$want.linux-$("$go" env GOARCH)") || {
			rm -rf "$tmp"
			echo "install-deps: could not fetch Go $want from the module proxy" >&2
			exit 1
		}
		mv "$tmp"/mod/golang.org/toolchain@* "$tmp/go"
		chmod -R u+w "$tmp/go"
		chmod +x "$tmp"/go/bin/* "$tmp"/go/pkg/tool/*/*
		rm -rf "$dir"
		mv "$tmp/go" "$dir"
		rm -rf "$tmp"
	fi
	ln -sfn "$dir" /usr/local/go
	echo "install-deps: /usr/local/go is Go $want ($dir)"
}
ensure_go
export PATH=/usr/local/go/bin:$PATH
[ -n "$build_only" ] && exit 0

# Kernel features the native runtime uses.
modprobe overlay 2>/dev/null || true
modprobe br_netfilter 2>/dev/null || true
modprobe veth 2>/dev/null || true

# crun refuses a cgroup v1 host whose hybrid v2 tree still holds a v1
# controller that is not mounted (here: hugetlb). Mount every v1 controller
# the kernel has that no hierarchy holds yet (idempotent; not kept across
# reboots). A cgroup v2 host is left alone.
for name in $(cgroup_v1_missing "$cgroup_root" "$cgroups_file"); do
	mkdir -p "$cgroup_root/$name"
	mount -t cgroup -o "$name" cgroup "$cgroup_root/$name" 2>/dev/null || echo "install-deps: could not mount cgroup $name" >&2
done
