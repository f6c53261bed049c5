#!/bin/sh
# check-generated.sh fails when internal/api/api.gen.go is not what
# oapi-codegen makes of api/openapi.yaml and internal/api/cfg.yaml today.
# It regenerates into a temporary directory, so the tree is never touched,
# and needs no git. Usage: scripts/check-generated.sh [repo-root]
set -eu

root=${1:-$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)}
cd "$root"

gen=internal/api/api.gen.go
for f in api/openapi.yaml internal/api/cfg.yaml "$gen"; do
	if [ ! -f "$f" ]; then
		echo "check-generated: $root/$f is missing" >&2
		exit 1
	fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# oapi-codegen writes to the config's `output` whatever -o says, so run it on
# a copy of the layout in the temporary directory, with the same config and
# the same relative spec path as `go generate` uses. The binary is the
# version go.mod pins as a tool.
mkdir -p "$tmp/internal/api" "$tmp/api"
cp internal/api/cfg.yaml "$tmp/internal/api/"
cp api/openapi.yaml "$tmp/api/"
if ! go build -o "$tmp/oapi-codegen" github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen 2>"$tmp/err"; then
	echo "check-generated: cannot build oapi-codegen (the go.mod tool):" >&2
	cat "$tmp/err" >&2
	exit 1
fi
if ! (cd "$tmp/internal/api" && "$tmp/oapi-codegen" -config cfg.yaml ../../api/openapi.yaml) 2>"$tmp/err"; then
	echo "check-generated: oapi-codegen failed on api/openapi.yaml:" >&2
	cat "$tmp/err" >&2
	exit 1
fi

if ! cmp -s "$gen" "$tmp/internal/api/api.gen.go"; then
	echo "check-generated: $gen is stale: it differs from what api/openapi.yaml and internal/api/cfg.yaml produce." >&2
	echo "Run 'go generate ./internal/api/' and commit the result (never edit $gen by hand)." >&2
	diff -u "$gen" "$tmp/internal/api/api.gen.go" | head -n 40 >&2 || true
	exit 1
fi
echo "check-generated: $gen is up to date"

# The E2B data plane's code (internal/e2b/envd) from api/e2b/envd/*.proto,
# generated the same way into the temporary directory.
mkdir -p "$tmp/envd"
if ! scripts/gen-envd.sh "$tmp/envd" 2>"$tmp/err"; then
	echo "check-generated: scripts/gen-envd.sh failed:" >&2
	cat "$tmp/err" >&2
	exit 1
fi
for f in $(cd "$tmp/envd" && find . -name '*.go' | sort); do
	if ! cmp -s "$f" "$tmp/envd/$f"; then
		echo "check-generated: $f is stale: it differs from what api/e2b/envd/*.proto produce." >&2
		echo "Run 'go generate ./internal/e2b/envd/' and commit the result (never edit it by hand)." >&2
		exit 1
	fi
done
echo "check-generated: internal/e2b/envd is up to date"
