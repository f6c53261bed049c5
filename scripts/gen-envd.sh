#!/bin/sh
# gen-envd.sh generates the Go code of the E2B data plane's Connect-RPC
# services (internal/e2b/envd) from the .proto files in api/e2b/envd, with
# protoc (Debian's protobuf-compiler) and the generators go.mod pins as
# tools. Usage: scripts/gen-envd.sh [out-dir] (default: the module root,
# so the code lands in internal/e2b/envd).
set -eu
root=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
out=${1:-$root}
cd "$root"
command -v protoc >/dev/null || { echo "gen-envd: protoc is missing (apt-get install protobuf-compiler)" >&2; exit 1; }
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT INT TERM
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
mod=github.com/sandgate/sandgate
pkg=$mod/internal/e2b/envd
m="Mprocess/process.proto=$pkg/process,Mfilesystem/filesystem.proto=$pkg/filesystem"
PATH="$bin:$PATH" protoc -I api/e2b/envd \
	--go_out="$out" --go_opt=module=$mod,$m \
	--connect-go_out="$out" --connect-go_opt=module=$mod,$m \
	process/process.proto filesystem/filesystem.proto
