#!/usr/bin/env bash
# Builds the web console (web/console) into internal/console/dist/app, which
# `go build` embeds into the moat binary. Installs the locked npm packages
# first when node_modules does not match package-lock.json
# (scripts/npm-ci.sh). Needs node and npm (scripts/install-deps.sh installs
# them); nothing is downloaded at run time of the binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/npm-ci.sh" "$here/../web/console"
cd "$here/../web/console"
npm run --silent build
