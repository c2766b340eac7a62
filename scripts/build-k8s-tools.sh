#!/usr/bin/env bash
# Build the Kubernetes test tools moat's envtest-based tests need, from the Go
# module proxy (no prebuilt binary downloads are reachable from CI):
#
#   kube-apiserver  k8s.io/kubernetes/cmd/kube-apiserver  (K8S_VERSION)
#   etcd            go.etcd.io/etcd/server/v3              (ETCD_VERSION)
#   kwok            sigs.k8s.io/kwok/cmd/kwok              (KWOK_VERSION)
#   controller-gen  sigs.k8s.io/controller-tools/cmd/controller-gen (CONTROLLER_TOOLS_VERSION)
#
# and, for the real single-node cluster (internal/k8s/kubenode):
#
#   kubelet, kube-scheduler, kube-controller-manager
#                   k8s.io/kubernetes/cmd/...              (K8S_VERSION)
#   containerd, containerd-shim-runc-v2, ctr
#                   github.com/containerd/containerd/v2    (CONTAINERD_VERSION;
#                   kubelet 1.37 needs containerd 2.x, Debian 12 has 1.6)
#   cni/bridge, cni/host-local, cni/loopback, cni/tuning
#                   github.com/containernetworking/plugins (CNI_VERSION)
#   helm            helm.sh/helm/v4/cmd/helm               (HELM_VERSION)
#   crictl          sigs.k8s.io/cri-tools/cmd/crictl       (CRICTL_VERSION;
#                   the node harness removes leftover pod sandboxes with it)
#
# runc comes from Debian (scripts/install-deps.sh).
#
# Binaries land in ${MOAT_CACHE:-/var/cache/moat}/k8s/<K8S_VERSION>/ (the
# directory KUBEBUILDER_ASSETS points at). Each is built in its own scratch
# module and skipped when it already exists, so reruns are instant. A cold
# kube-apiserver build takes ~15-20 minutes on 2 cores; the other Kubernetes
# binaries reuse most of its build cache.
#
# Usage: scripts/build-k8s-tools.sh [--print-dir | controller-gen]
#   no argument      build every tool the tests use (all but controller-gen)
#   controller-gen   build controller-gen only (make generate-k8s)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=${STAGING_VERSION:-v0.${K8S_VERSION#v1.}}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
CONTROLLER_TOOLS_VERSION=${CONTROLLER_TOOLS_VERSION:-v0.23.0}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CNI_VERSION=${CNI_VERSION:-v1.10.0}
HELM_VERSION=${HELM_VERSION:-v4.3.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
CACHE=${MOAT_CACHE:-/var/cache/moat}
OUT="$CACHE/k8s/$K8S_VERSION"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$OUT"
	exit 0
fi

export PATH="/usr/local/go/bin:$PATH"
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$OUT/src"

# One builder at a time (make test may run while a background build is going);
# controller-gen has its own lock, so that make lint's check-generated-k8s
# does not wait for the test tools that make test-setup builds meanwhile.
lock=$OUT/.lock
[[ "${1:-}" == controller-gen ]] && lock=$OUT/.lock-controller-gen
exec 9>"$lock"
flock 9

log() { echo "build-k8s-tools: $*" >&2; }

# scratch NAME: fresh module directory for one tool.
scratch() {
	local d="$OUT/src/$1"
	rm -rf "$d"
	mkdir -p "$d"
	(cd "$d" && go mod init "moat.local/k8stools/$1" >/dev/null 2>&1)
	echo "$d"
}

install_bin() { # install_bin TMPFILE NAME
	chmod 0755 "$1"
	mv -f "$1" "$OUT/$2"
	log "built $OUT/$2"
}

build_controller_gen() {
	[[ -x "$OUT/controller-gen" ]] && return 0
	log "building controller-gen $CONTROLLER_TOOLS_VERSION"
	local d
	d=$(scratch controller-gen)
	(
		cd "$d"
		go get "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
		go build -trimpath -o "$d/controller-gen.tmp" sigs.k8s.io/controller-tools/cmd/controller-gen
	)
	install_bin "$d/controller-gen.tmp" controller-gen
}

build_etcd() {
	[[ -x "$OUT/etcd" ]] && return 0
	log "building etcd $ETCD_VERSION"
	local d
	d=$(scratch etcd)
	(
		cd "$d"
		go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
		go build -trimpath -o "$d/etcd.tmp" go.etcd.io/etcd/server/v3
	)
	install_bin "$d/etcd.tmp" etcd
}

build_kwok() {
	[[ -x "$OUT/kwok" ]] && return 0
	log "building kwok $KWOK_VERSION"
	local d
	d=$(scratch kwok)
	(
		cd "$d"
		go get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
		go build -trimpath -o "$d/kwok.tmp" \
			-ldflags "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$K8S_VERSION" \
			sigs.k8s.io/kwok/cmd/kwok
	)
	install_bin "$d/kwok.tmp" kwok
}

# build_kubernetes builds every missing binary of k8s.io/kubernetes in one
# scratch module (one `go build`, so shared packages compile once).
KUBE_BINS=(kube-apiserver kube-scheduler kube-controller-manager kubelet)
build_kubernetes() {
	local missing=() b
	for b in "${KUBE_BINS[@]}"; do
		[[ -x "$OUT/$b" ]] || missing+=("$b")
	done
	((${#missing[@]} > 0)) || return 0
	log "building ${missing[*]} $K8S_VERSION (staging modules $STAGING_VERSION); this takes a while"
	local d gomod
	d=$(scratch kubernetes)
	(
		cd "$d"
		# k8s.io/kubernetes replaces every staging module with ./staging/...;
		# pin each to its published release instead.
		gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
		[[ -f "$gomod" ]] || { log "cannot read go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
		local args=()
		while read -r mod; do
			args+=("-replace=$mod=$mod@$STAGING_VERSION")
		done < <(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#\1#p' "$gomod")
		((${#args[@]} > 0)) || { log "no staging replaces found in $gomod"; exit 1; }
		go mod edit "${args[@]}"
		go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
		local pkgs=()
		for b in "${missing[@]}"; do
			go get "k8s.io/kubernetes/cmd/$b@$K8S_VERSION"
			pkgs+=("k8s.io/kubernetes/cmd/$b")
		done
		local minor=${K8S_VERSION#v1.}
		minor=${minor%%.*}
		mkdir -p "$d/bin"
		go build -trimpath -o "$d/bin/" \
			-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
			"${pkgs[@]}"
	)
	for b in "${missing[@]}"; do
		install_bin "$d/bin/$b" "$b"
	done
}

build_containerd() {
	local b missing=0
	for b in containerd containerd-shim-runc-v2 ctr; do
		[[ -x "$OUT/$b" ]] || missing=1
	done
	((missing)) || return 0
	log "building containerd $CONTAINERD_VERSION"
	local d m=github.com/containerd/containerd/v2
	d=$(scratch containerd)
	(
		cd "$d"
		go get "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$m/cmd/ctr@$CONTAINERD_VERSION"
		mkdir -p "$d/bin"
		# CGO off: no btrfs snapshotter (overlayfs and native remain).
		go build -trimpath -o "$d/bin/" -tags "no_btrfs no_devmapper" \
			-ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Package=$m" \
			"$m/cmd/containerd" "$m/cmd/containerd-shim-runc-v2" "$m/cmd/ctr"
	)
	for b in containerd containerd-shim-runc-v2 ctr; do
		install_bin "$d/bin/$b" "$b"
	done
}

CNI_PLUGINS=(main/bridge ipam/host-local main/loopback meta/tuning)
build_cni() {
	local p missing=()
	for p in "${CNI_PLUGINS[@]}"; do
		[[ -x "$OUT/cni/${p#*/}" ]] || missing+=("github.com/containernetworking/plugins/plugins/$p")
	done
	((${#missing[@]} > 0)) || return 0
	log "building CNI plugins $CNI_VERSION"
	local d
	d=$(scratch cni)
	(
		cd "$d"
		go get "${missing[@]/%/@$CNI_VERSION}"
		mkdir -p "$d/bin"
		go build -trimpath -o "$d/bin/" -ldflags "-s -w" "${missing[@]}"
	)
	mkdir -p "$OUT/cni"
	for p in "${CNI_PLUGINS[@]}"; do
		[[ -f "$d/bin/${p#*/}" ]] && install_bin "$d/bin/${p#*/}" "cni/${p#*/}"
	done
}

build_helm() {
	[[ -x "$OUT/helm" ]] && return 0
	log "building helm $HELM_VERSION"
	local d
	d=$(scratch helm)
	(
		cd "$d"
		go get "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
		go build -trimpath -o "$d/helm.tmp" -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" helm.sh/helm/v4/cmd/helm
	)
	install_bin "$d/helm.tmp" helm
}

build_crictl() {
	[[ -x "$OUT/crictl" ]] && return 0
	log "building crictl $CRICTL_VERSION"
	local d
	d=$(scratch crictl)
	(
		cd "$d"
		go get "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
		go build -trimpath -o "$d/crictl.tmp" -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl
	)
	install_bin "$d/crictl.tmp" crictl
}

# controller-gen only generates code (make generate-k8s, and make lint's
# check-generated-k8s); no test runs it.
if [[ "${1:-}" == controller-gen ]]; then
	build_controller_gen
	exit 0
fi

# Two lanes at once: the Kubernetes binaries (most of the time), and the
# other tools one after the other. A cold build spends part of each tool's
# time downloading modules; the other lane compiles meanwhile.
build_kubernetes &
kube=$!
{
	build_etcd
	build_kwok
	build_helm
	build_cni
	build_containerd
	build_crictl
} &
rest=$!
rc=0
wait "$kube" || rc=1
wait "$rest" || rc=1
((rc == 0)) || { log "a build failed (see above)"; exit 1; }
log "all test tools present in $OUT"
