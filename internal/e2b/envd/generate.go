// Package envd holds the Go code generated from the E2B data plane's
// .proto files (api/e2b/envd): the messages in process and filesystem,
// the Connect-RPC handlers in processconnect and filesystemconnect. Never
// edit it by hand: go generate ./internal/e2b/envd/ (protoc and the
// generators go.mod pins as tools); scripts/check-generated.sh fails when
// it is stale.
package envd

//go:generate ../../../scripts/gen-envd.sh
