// Package apispec embeds the OpenAPI contract of sandgate, api/openapi.yaml,
// so the gateway can serve it verbatim at GET /openapi.yaml.
package apispec

import _ "embed"

// YAML is the contents of openapi.yaml. Callers must not modify it.
//
//go:embed openapi.yaml
var YAML []byte
