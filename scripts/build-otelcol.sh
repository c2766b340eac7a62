#!/usr/bin/env bash
# Build the test OpenTelemetry Collector (tools/otelcol: the OTLP receiver
# and the file and debug exporters, wired without the collector builder)
# into ${MOAT_CACHE:-/var/cache/moat}/otelcol/<OTELCOL_VERSION>-<key>/otelcol,
# cached by version and source. tools/otelcol is a module of its own, so the
# collector's dependencies never reach moat's go.mod. About 7 minutes on
# 2 busy cores with a cold module cache (1.5 min of CPU); `make test-setup` builds it,
# and the e2e test of the audit trail's OTLP export starts it.
#
# Usage: scripts/build-otelcol.sh [--print]
set -euo pipefail

OTELCOL_VERSION=${OTELCOL_VERSION:-v0.165.0}
CACHE=${MOAT_CACHE:-/var/cache/moat}
here=$(cd "$(dirname "$0")/.." && pwd)
# Keyed by the collector's version and its source: a change rebuilds.
key=$(cat "$here/tools/otelcol/main.go" "$here/tools/otelcol/go.sum" | sha256sum | cut -c1-12)
OUT="$CACHE/otelcol/$OTELCOL_VERSION-$key"

if [[ "${1:-}" == "--print" ]]; then
	echo "$OUT/otelcol"
	exit 0
fi
[[ -x "$OUT/otelcol" ]] && exit 0

export PATH="/usr/local/go/bin:$PATH"
export GOWORK=off GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
[[ -x "$OUT/otelcol" ]] && exit 0
echo "build-otelcol: building tools/otelcol (collector $OTELCOL_VERSION)" >&2
(cd "$here/tools/otelcol" && go build -o "$OUT/.otelcol" .)
mv "$OUT/.otelcol" "$OUT/otelcol"
