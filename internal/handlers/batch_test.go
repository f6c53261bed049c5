package handlers

import (
	"sync/atomic"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// A create with count answers a SandboxBatch; with allow_partial, the
// failed creates come with their index and problem; bad counts are 422.
func TestCreateBatchHTTP(t *testing.T) {
	g := newGateway(t, 0)
	var batch struct {
		Sandboxes []struct {
			ID    string `json:"sandbox_id"`
			Token string `json:"lease_token"`
		} `json:"sandboxes"`
		Failed []struct {
			Index   int `json:"index"`
			Problem struct {
				Status int    `json:"status"`
				Code   string `json:"code"`
			} `json:"problem"`
		} `json:"failed"`
	}
	r := g.do("POST", "/v1/sandboxes", map[string]any{"count": 3}, key())
	if r.status != 201 {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}
	r.json(t, &batch)
	if len(batch.Sandboxes) != 3 || len(batch.Failed) != 0 || batch.Sandboxes[0].Token == "" {
		t.Fatalf("batch: %s", r.body)
	}
	for _, c := range []any{0, 65, "two"} {
		if r := g.do("POST", "/v1/sandboxes", map[string]any{"count": c}, key()); r.status != 422 {
			t.Errorf("count %v: %d %s", c, r.status, r.body)
		}
	}
	var n atomic.Int32
	g.p.CreateCheck = func(providers.CreateSpec) error {
		if n.Add(1) == 2 {
			return providers.Errorf(providers.ErrUnavailable, "hiccup")
		}
		return nil
	}
	r = g.do("POST", "/v1/sandboxes", map[string]any{"count": 3, "allow_partial": true}, key())
	batch.Sandboxes, batch.Failed = nil, nil
	r.json(t, &batch)
	if r.status != 201 || len(batch.Sandboxes) != 2 || len(batch.Failed) != 1 || batch.Failed[0].Problem.Status != 503 || batch.Failed[0].Problem.Code != "unavailable" {
		t.Fatalf("partial batch: %d %s", r.status, r.body)
	}
	n.Store(0)
	if r := g.do("POST", "/v1/sandboxes", map[string]any{"count": 3}, key()); r.status != 503 {
		t.Fatalf("all-or-nothing batch with a failure: %d %s", r.status, r.body)
	}
}
