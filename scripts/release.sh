#!/usr/bin/env bash
# Builds a moat release into dist/ (`make release`; VERSION defaults to
# v<appVersion of the Helm chart>):
#   moat-<VERSION>-linux-<arch>.tar.gz  a static moat for each arch (amd64,
#                                       arm64) carrying the agent built for
#                                       that arch, with README.md
#   moat-<VERSION>-oci/                 the OCI image (multi-arch index,
#                                       entrypoint /moat), an image layout
#   moat-<VERSION>-oci.tar              the same layout as a tarball
#   SHA256SUMS                          of the archives and the tarball
# The console is built once before (make console). The agent payload that
# moat embeds is per arch, so the arches are built one after the other,
# and the host's own agent is put back at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
VERSION=${VERSION:-v$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/moat/Chart.yaml)}
COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
ARCHES=${ARCHES:-amd64 arm64}
IMAGE=${IMAGE:-ghcr.io/moat-sandbox/moat}
DIST=${DIST:-dist}
PAYLOAD=internal/agentbin/payload/moat-agent
BUILDINFO=github.com/moat-sandbox/moat/internal/buildinfo
export CGO_ENABLED=0

log() { echo "release: $*" >&2; }

restore_agent() {
	$GO build -trimpath -ldflags='-s -w' -o bin/moat-agent ./cmd/moat-agent &&
		cp bin/moat-agent "$PAYLOAD.tmp" && mv "$PAYLOAD.tmp" "$PAYLOAD"
}
trap restore_agent EXIT

rm -rf "$DIST"
mkdir -p "$DIST/build"
images=()
for arch in $ARCHES; do
	name=moat-$VERSION-linux-$arch
	stage=$DIST/build/$name
	mkdir -p "$stage"
	log "$name: agent"
	GOOS=linux GOARCH=$arch $GO build -trimpath -ldflags='-s -w' -o "$DIST/build/moat-agent-$arch" ./cmd/moat-agent
	cp "$DIST/build/moat-agent-$arch" "$PAYLOAD.tmp" && mv "$PAYLOAD.tmp" "$PAYLOAD"
	log "$name: moat"
	GOOS=linux GOARCH=$arch $GO build -trimpath \
		-ldflags="-s -w -X $BUILDINFO.version=$VERSION -X $BUILDINFO.commit=$COMMIT" -o "$stage/moat" ./cmd/moat
	cp README.md "$stage/"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" -C "$DIST/build" -cf - "$name" |
		gzip -n -9 >"$DIST/$name.tar.gz"
	images+=("linux/$arch=$stage/moat")
done

log "image $IMAGE:$VERSION"
$GO run ./cmd/moat-release --ref "$IMAGE:$VERSION" --version "$VERSION" --commit "$COMMIT" \
	--created "$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)" \
	--layout "$DIST/moat-$VERSION-oci" --archive "$DIST/moat-$VERSION-oci.tar" "${images[@]}"

(cd "$DIST" && sha256sum -- *.tar.gz "moat-$VERSION-oci.tar" >SHA256SUMS)
rm -rf "$DIST/build"
log "done: $(cd "$DIST" && echo *)"
