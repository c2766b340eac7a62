#!/usr/bin/env bash
# Installs the locked npm packages of a directory (npm ci) unless its
# node_modules already holds every package of package-lock.json at the
# locked version, so reruns are instant. Used for the web console
# (scripts/build-console.sh) and, by `make deps-npm`, for the JS SDK
# compatibility test (test/compat/js).
#
# Usage: scripts/npm-ci.sh DIR
set -euo pipefail
cd "${1:?usage: npm-ci.sh DIR}"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "npm-ci: node and npm are needed in $PWD (run: make deps)" >&2
	exit 1
fi

# npm ci writes node_modules/.package-lock.json; when it holds the
# committed lockfile's package set, the install is current. Optional
# packages may be absent (npm skips those of other platforms).
if ! node -e '
	const fs = require("fs")
	const want = JSON.parse(fs.readFileSync("package-lock.json")).packages
	const have = JSON.parse(fs.readFileSync("node_modules/.package-lock.json")).packages
	for (const [p, v] of Object.entries(want)) {
		if (p === "" || v.optional && !have[p]) continue
		if (!have[p] || have[p].version !== v.version) process.exit(1)
	}
' 2>/dev/null; then
	echo "npm-ci: npm ci in $PWD" >&2
	npm ci --no-audit --no-fund --loglevel=error
fi
