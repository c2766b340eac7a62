#!/usr/bin/env bash
# Installs the Debian packages moat needs to run and test (idempotent).
# Runs as root on Debian 12. Nothing is downloaded but Debian packages and
# Go modules.
set -euo pipefail

pkgs=(runc crun runsc busybox-static nftables iproute2 ca-certificates git make)
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
