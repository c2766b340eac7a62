#!/usr/bin/env bash
# Installs the Debian packages moat needs to run and test (idempotent).
# Runs as root on Debian 12. Nothing is downloaded but Debian packages and
# Go modules.
set -euo pipefail

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

# stress-ng: the CPU hog the chaos test (test/e2e) runs under.
# python3-ipykernel: a real Jupyter kernel for the execd Jupyter backend tests;
# default-jdk-headless and node-typescript: the agent's built-in Java
# (jshell) and TypeScript drivers, tested on the host (internal/execd/code).
# debootstrap: scripts/build-test-images.sh (installed here so that no apt
# runs while `make test-setup` builds its stages at once).
# redis-server: the Go SDK pool's Redis state store (test/compat/go).
pkgs=(runc crun runsc busybox-static nftables iproute2 ca-certificates git make stress-ng python3-ipykernel default-jdk-headless node-typescript debootstrap redis-server)
missing=()
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

if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then
		export PATH=/usr/local/go/bin:$PATH
	else
		echo "install-deps: Go toolchain not found (expected /usr/local/go)" >&2
		exit 1
	fi
fi

# Kernel features the native runtime uses.
modprobe overlay 2>/dev/null || true
modprobe br_netfilter 2>/dev/null || true
modprobe veth 2>/dev/null || true

# crun refuses a cgroup v1 host whose hybrid v2 tree still holds a v1
# controller that is not mounted (here: hugetlb). Mount every v1 controller
# the kernel has that is not yet mounted (idempotent; not kept across reboots).
if [ -d /sys/fs/cgroup ] && ! grep -q ' /sys/fs/cgroup cgroup2 ' /proc/self/mountinfo; then
	while read -r name _ _ enabled; do
		[ "$name" = "#subsys_name" ] && continue
		[ "$enabled" = 1 ] || continue
		if ! grep -qE " /sys/fs/cgroup/[^ ]*${name}[^ ]* " /proc/self/mountinfo; then
			mkdir -p "/sys/fs/cgroup/$name"
			mount -t cgroup -o "$name" cgroup "/sys/fs/cgroup/$name" 2>/dev/null || echo "install-deps: could not mount cgroup $name" >&2
		fi
	done < /proc/cgroups
fi
