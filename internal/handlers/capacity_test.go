package handlers

import (
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/sandbox"
)

// TestCapacity503: a create that waited its whole queue timeout gets 503
// with Retry-After; a health check stays green and readyz follows the
// provider.
func TestCapacity503(t *testing.T) {
	g := newGateway(t, 0, func(o *sandbox.Options) { o.MaxSandboxes = 1; o.QueueTimeout = 100 * time.Millisecond })
	g.create(map[string]any{})
	r := g.do("POST", "/v1/sandboxes", map[string]any{}, key())
	if r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("over capacity: %d Retry-After=%q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	r.problem(t)
	if r := g.do("GET", "/healthz", nil, nil); r.status != 200 {
		t.Fatalf("healthz %d", r.status)
	}
	if r := g.do("GET", "/readyz", nil, nil); r.status != 200 {
		t.Fatalf("readyz %d %s", r.status, r.body)
	}
	g.p.PingErr = errors.New("daemon down")
	r = g.do("GET", "/readyz", nil, nil)
	if r.status != 503 {
		t.Fatalf("readyz with provider down: %d", r.status)
	}
	r.problem(t)
}

func TestServesContract(t *testing.T) {
	g := newGateway(t, 0)
	r := g.do("GET", "/openapi.yaml", nil, nil)
	if r.status != 200 || len(r.body) < 1000 || string(r.body[:8]) != "openapi:" {
		t.Fatalf("openapi.yaml: %d %q", r.status, r.body[:min(len(r.body), 40)])
	}
	if id := g.do("GET", "/healthz", nil, map[string]string{"X-Request-Id": "abc-123"}).header.Get("X-Request-Id"); id != "abc-123" {
		t.Fatalf("request id not echoed: %q", id)
	}
}
