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
# Usage: scripts/build-runsc.sh [--print-dir]
set -euo pipefail

RUNSC_VERSION=${RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
CACHE=${MOAT_CACHE:-/var/cache/moat}
OUT="$CACHE/runsc/$RUNSC_VERSION"

if [[ "${1:-}" == "--print-dir" ]]; then
	echo "$OUT"
	exit 0
fi
[[ -x "$OUT/runsc" ]] && exit 0

export PATH="/usr/local/go/bin:$PATH"
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
[[ -x "$OUT/runsc" ]] && exit 0

# The pseudo-version's date becomes runsc's version string (0.0~YYYYMMDD.0,
# Debian's spelling), so `runsc --version` tells which gVisor it is.
date=${RUNSC_VERSION#v0.0.0-}
date=${date:0:8}
echo "build-runsc: building gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2
GOBIN="$OUT/.bin" go install \
	-ldflags "-X gvisor.dev/gvisor/runsc/version.version=0.0~$date.0" \
	"gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
mv -f "$OUT/.bin/runsc" "$OUT/runsc"
rmdir "$OUT/.bin"
"$OUT/runsc" --version >&2
