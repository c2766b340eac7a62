#!/usr/bin/env bash
# Builds the web console (web/console) into internal/console/dist/app, which
# `go build` embeds into the moat binary. Installs the locked npm packages
# first when node_modules does not match package-lock.json. Needs node and
# npm (scripts/install-deps.sh installs them); nothing is downloaded at run
# time of the binary.
set -euo pipefail
cd "$(dirname "$0")/../web/console"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "build-console: node and npm are needed to build the web console (run: make deps)" >&2
	exit 1
fi

# npm ci writes node_modules/.package-lock.json; when it equals the
# committed lockfile's package set, the install is current.
if ! node -e '
	const fs = require("fs")
	const want = JSON.parse(fs.readFileSync("package-lock.json")).packages
	const have = JSON.parse(fs.readFileSync("node_modules/.package-lock.json")).packages
	for (const [p, v] of Object.entries(want)) {
		if (p === "" || v.optional && !have[p]) continue
		if (!have[p] || have[p].version !== v.version) process.exit(1)
	}
' 2>/dev/null; then
	echo "build-console: npm ci"
	npm ci --no-audit --no-fund --loglevel=error
fi
npm run --silent build
