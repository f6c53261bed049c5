package api_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"go.uber.org/goleak"

	apispec "github.com/sandgate/sandgate/api"
	"github.com/sandgate/sandgate/internal/api"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// excludedTags mirrors output-options.exclude-tags in cfg.yaml: operations
// with these tags are documented in the YAML but not generated (and so are
// absent from the embedded spec).
var excludedTags = []string{"websocket", "proxy", "ops", "streams"}

// operationIDs are the names handlers and clients code against.
var operationIDs = []string{
	// sandboxes
	"createSandbox", "listSandboxes", "getSandbox", "getSandboxStatus", "getSandboxMetrics", "execCommand",
	"uploadFile", "downloadFile", "putFile", "getFile", "statFile", "listFiles", "createLease", "listLeases", "releaseLease", "revokeLease", "createSnapshot", "forkSandbox", "listSnapshots", "listImages", "getSnapshot", "deleteSnapshot", "createVolume", "listVolumes", "getVolume", "deleteVolume", "setSandboxNetwork", "setSandboxHosts", "getQuota",
	"renewSandbox", "pauseSandbox", "resumeSandbox", "getEndpoint", "deleteSandbox",
	// pty
	"createPtySession", "listPtySessions", "getPtySession", "deletePtySession",
	// commands
	"startCommand", "listCommands", "getCommand", "deleteCommand", "waitCommand", "signalCommand",
	// streams
	"readCommandOutput",
	// websocket
	"attachPtySession",
	// proxy
	"proxySandboxPort",
	// ops
	"healthz", "readyz", "metrics", "getOpenAPI", "terminalPage",
}

func loadYAML(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(apispec.YAML)
	if err != nil {
		t.Fatalf("load api/openapi.yaml: %v", err)
	}
	return doc
}

func TestSpecIsValid(t *testing.T) {
	doc := loadYAML(t)
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml is invalid: %v", err)
	}
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi = %q, want 3.0.3", doc.OpenAPI)
	}
}

func TestOperationIDs(t *testing.T) {
	doc := loadYAML(t)
	have := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", method, path)
				continue
			}
			if have[op.OperationID] {
				t.Errorf("operationId %q is used twice", op.OperationID)
			}
			have[op.OperationID] = true
		}
	}
	for _, id := range operationIDs {
		if !have[id] {
			t.Errorf("operationId %q is missing", id)
		}
		delete(have, id)
	}
	for id := range have {
		t.Errorf("operationId %q is not in the list of known operations", id)
	}
}

// TestEmbeddedSpecIsFresh catches an api.gen.go generated from an older YAML
// or config: the embedded spec must equal api/openapi.yaml with the
// operations of the excluded tags removed (as oapi-codegen removes them), and
// the paths of both must be the same.
func TestEmbeddedSpecIsFresh(t *testing.T) {
	want := loadYAML(t)
	got, err := api.GetSwagger()
	if err != nil {
		t.Fatalf("GetSwagger: %v", err)
	}

	generated := 0
	for _, item := range want.Paths.Map() {
		for method, op := range item.Operations() {
			if slices.ContainsFunc(op.Tags, func(tag string) bool { return slices.Contains(excludedTags, tag) }) {
				item.SetOperation(method, nil)
				continue
			}
			generated++
		}
	}
	if generated == 0 {
		t.Fatal("no operation is generated")
	}

	if w, g := want.Paths.InMatchingOrder(), got.Paths.InMatchingOrder(); !slices.Equal(w, g) {
		t.Errorf("paths differ: regenerate\nyaml:     %q\nembedded: %q", w, g)
	}
	for path, witem := range want.Paths.Map() {
		gitem := got.Paths.Value(path)
		if gitem == nil {
			continue // reported above
		}
		for method, wop := range witem.Operations() {
			gop := gitem.GetOperation(method)
			if gop == nil {
				t.Errorf("%s %s (%s) is not generated: regenerate", method, path, wop.OperationID)
			} else if mustJSON(t, wop) != mustJSON(t, gop) {
				t.Errorf("%s %s (%s) differs between the YAML and the embedded spec: regenerate", method, path, wop.OperationID)
			}
		}
		for method, gop := range gitem.Operations() {
			if witem.GetOperation(method) == nil {
				t.Errorf("%s %s (%s) is generated but not in the YAML: regenerate", method, path, gop.OperationID)
			}
		}
	}
	for name, ws := range want.Components.Schemas {
		if gs, ok := got.Components.Schemas[name]; !ok {
			t.Errorf("schema %s is not generated: regenerate", name)
		} else if mustJSON(t, ws) != mustJSON(t, gs) {
			t.Errorf("schema %s differs between the YAML and the embedded spec: regenerate", name)
		}
	}
	// Whatever the checks above did not name (info, parameters, responses,
	// security schemes, a schema only in the embedded spec) is caught here.
	if mustJSON(t, want) != mustJSON(t, got) {
		t.Error("the embedded spec differs from api/openapi.yaml: regenerate (go generate ./internal/api/)")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return string(b)
}
