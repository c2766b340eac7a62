#!/usr/bin/env bash
# Makes a Docker daemon usable for the docker runtime backend (idempotent).
# Runs as root on Debian 12 without systemd: installs the Debian docker.io
# package if needed and starts dockerd in the background if it is not
# answering on its socket.
#
# The daemon is configured so that nothing it sets up sends traffic off
# the machine, and so that it does not rewrite the host firewall that moat's
# own network code manages:
#   --iptables=false   no NAT/MASQUERADE rules, no FORWARD policy change
#   --ip-forward=false dockerd does not turn on IP forwarding
#   --bridge=none      no default docker0 network; moat creates its own
#                      (internal, host bridge named moatd-<hash>)
# Docker does not enforce "internal" without iptables (containers still get
# a default route via the host). A moat server firewalls its network's
# bridge itself, as for native sandboxes (table inet moat-host-<bridge>:
# forwarding out with NAT, subject to each sandbox's egress policy; no
# bridge-to-bridge traffic; the host reachable only for DNS to the
# gateway). This script adds nft table "inet moat-docker" as a backstop
# for every moatd-* bridge, served or not: from them the host accepts only
# replies, DNS, IPv6 neighbour discovery (dual-stack networks) and
# connections redirected to the Credential Vault proxy.
#
# Environment: DOCKER_HOST_SOCK (default /var/run/docker.sock),
# DOCKERD_LOG (default /var/log/dockerd.log), DOCKERD_TIMEOUT (seconds, 60).
set -euo pipefail

sock=${DOCKER_HOST_SOCK:-/var/run/docker.sock}
log=${DOCKERD_LOG:-/var/log/dockerd.log}
timeout=${DOCKERD_TIMEOUT:-60}

if [ "$(id -u)" != 0 ]; then
	echo "docker-setup: must run as root" >&2
	exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || [ ! -x /usr/bin/docker ]; then
	echo "docker-setup: installing docker.io"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y -qq --no-install-recommends docker.io >/dev/null; then
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends docker.io >/dev/null
	fi
fi

# The Debian client, not whatever else is first in PATH.
docker=/usr/bin/docker

ready() { "$docker" -H "unix://$sock" version >/dev/null 2>&1; }

# Contain the sandbox networks (idempotent: the table is replaced).
if command -v nft >/dev/null 2>&1; then
	nft -f - <<'NFT'
table inet moat-docker
delete table inet moat-docker
table inet moat-docker {
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname "moatd-*" ct state established,related accept
		iifname "moatd-*" meta l4proto { tcp, udp } th dport 53 accept
		iifname "moatd-*" meta mark 0x6d766c74 accept
		iifname "moatd-*" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept
		iifname "moatd-*" counter drop
	}
}
NFT
else
	echo "docker-setup: nft not found; cannot contain sandbox networks" >&2
	exit 1
fi

if ready; then
	exit 0
fi

modprobe overlay 2>/dev/null || true
modprobe br_netfilter 2>/dev/null || true

if ! pgrep -x dockerd >/dev/null 2>&1; then
	echo "docker-setup: starting dockerd (log: $log)"
	mkdir -p "$(dirname "$log")"
	setsid nohup dockerd \
		-H "unix://$sock" \
		--iptables=false \
		--ip-forward=false \
		--bridge=none \
		--exec-opt native.cgroupdriver=cgroupfs \
		</dev/null >>"$log" 2>&1 &
fi

for _ in $(seq $((timeout * 5))); do
	if ready; then
		echo "docker-setup: dockerd is ready ($("$docker" -H "unix://$sock" version -f '{{.Server.Version}}'))"
		exit 0
	fi
	sleep 0.2
done
echo "docker-setup: dockerd did not answer on $sock within ${timeout}s; last log lines:" >&2
tail -n 30 "$log" >&2 || true
exit 1
