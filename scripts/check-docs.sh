#!/usr/bin/env bash
# Fails if a Go package of the module is missing from README.md's "What is
# where" table or from docs/ARCHITECTURE.md. A README row may cover a
# subpackage by naming it relative to an ancestor row: the row of
# `internal/egress` covers internal/egress/nft with `nft/`.
set -euo pipefail
cd "$(dirname "$0")/.."
readme=$(sed -n '/^## What is where/,/^## /p' README.md)
fail=0
for p in $(go list ./... | sed 's#^github.com/moat-sandbox/moat/##'); do
	ok=0
	if grep -qF "\`$p\`" <<<"$readme"; then
		ok=1
	else
		a=$p
		while [[ $a == */* ]]; do
			a=${a%/*}
			rel=${p#"$a"/}
			if grep -F "| \`$a\`" <<<"$readme" | grep -qF "\`$rel/\`"; then
				ok=1
				break
			fi
		done
	fi
	if [[ $ok == 0 ]]; then
		echo "README.md \"What is where\" does not name $p" >&2
		fail=1
	fi
	if ! grep -qF "\`$p\`" docs/ARCHITECTURE.md; then
		echo "docs/ARCHITECTURE.md does not name \`$p\`" >&2
		fail=1
	fi
done
exit $fail
