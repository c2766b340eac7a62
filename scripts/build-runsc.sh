#!/usr/bin/env bash
# Build a current gVisor runsc from the Go module proxy (gvisor.dev/gvisor,
# its Go-buildable "go" branch as the proxy serves it) into
# ${MOAT_CACHE:-/var/cache/moat}/runsc/<RUNSC_VERSION>/runsc, cached by version.
#
# Why: Debian 12's runsc (0.0~20221219) cannot checkpoint a sandbox whose
# netstack has (or recently had) a TCP connection, which every moat sandbox
# has (the agent is reached over TCP). This build can: see
# docs/SNAPSHOTS.md. `make run` and `make
# test` put its directory first on PATH (PATH="$(scripts/build-runsc.sh
# --print-dir):$PATH"), so moat's runsc class uses it. About 75 s on 2 idle
# cores once the modules are downloaded.
#
# It also builds gVisor's containerd shim (gvisor.dev/gvisor/shim, the same
# version) as containerd-shim-runsc-v1 beside runsc: the real-node
# Kubernetes tests give their containerd a runsc runtime handler with it.
#
# Usage: scripts/build-runsc.sh [--print-dir]
set -euo pipefail

RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
CACHE=${MOAT_CACHE:-/var/cache/moat}
OUT="$CACHE/runsc/$RUNSC_VERSION"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$OUT"
	exit 0
fi
[[ -x "$OUT/runsc" && -x "$OUT/containerd-shim-runsc-v1" ]] && exit 0

export PATH="/usr/local/go/bin:$PATH"
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
[[ -x "$OUT/runsc" && -x "$OUT/containerd-shim-runsc-v1" ]] && exit 0

# The pseudo-version's date becomes runsc's version string (0.0~YYYYMMDD.0,
# Debian's spelling), so `runsc --version` tells which gVisor it is.
date=${RUNSC_VERSION#v0.0.0-}
date=${date:0:8}
if [[ ! -x "$OUT/runsc" ]]; then
	echo "build-runsc: building gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2
	GOBIN="$OUT/.bin" go install \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=0.0~$date.0" \
		"gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
	mv -f "$OUT/.bin/runsc" "$OUT/runsc"
	"$OUT/runsc" --version >&2
fi
if [[ ! -x "$OUT/containerd-shim-runsc-v1" ]]; then
	echo "build-runsc: building gvisor.dev/gvisor/shim@$RUNSC_VERSION (containerd-shim-runsc-v1)" >&2
	# The shim lowers its own OOM score to -999 and fails when it may not;
	# that needs CAP_SYS_RESOURCE, which CI's root lacks. This build (for
	# the test node only) keeps the inherited score when refused, as
	# containerd's restrict_oom_score_adj does for runc (no log line: the
	# start command's stdout is its answer to containerd). One line changed, in a copy of
	# the module (the module cache is read-only, and -overlay may not
	# replace files in it).
	src=$(go mod download -json "gvisor.dev/gvisor@$RUNSC_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
	[[ -d "$src" ]] || { echo "build-runsc: cannot find gvisor.dev/gvisor@$RUNSC_VERSION" >&2; exit 1; }
	rm -rf "$OUT/.src"
	cp -r "$src" "$OUT/.src"
	chmod -R u+w "$OUT/.src"
	mgr="$OUT/.src/pkg/shim/v1/manager.go"
	old='return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)'
	grep -qF "$old" "$mgr" || { echo "build-runsc: $mgr changed: review the OOM score patch" >&2; exit 1; }
	sed -i "s|$old|if !os.IsPermission(err) { $old }|" "$mgr"
	mkdir -p "$OUT/.bin"
	(cd "$OUT/.src" && go build -trimpath -ldflags "-s -w" -o "$OUT/.bin/shim" ./shim)
	rm -rf "$OUT/.src"
	mv -f "$OUT/.bin/shim" "$OUT/containerd-shim-runsc-v1"
fi
rmdir "$OUT/.bin" 2>/dev/null || true
