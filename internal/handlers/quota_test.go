package handlers

import (
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/sandbox"
)

type quotaBody struct {
	Limits struct {
		Sandboxes int `json:"sandboxes"`
		Snapshots int `json:"snapshots"`
	} `json:"limits"`
	Usage struct {
		Sandboxes             int   `json:"sandboxes"`
		MemoryMib             int64 `json:"memory_mib"`
		Snapshots             int   `json:"snapshots"`
		SnapshotBytes         int64 `json:"snapshot_bytes"`
		OrphanedSnapshots     int   `json:"orphaned_snapshots"`
		OrphanedSnapshotBytes int64 `json:"orphaned_snapshot_bytes"`
	} `json:"usage"`
	Gateway struct {
		Sandboxes       int   `json:"sandboxes"`
		MemoryMib       int64 `json:"memory_mib"`
		MemoryBudgetMib int64 `json:"memory_budget_mib"`
	} `json:"gateway"`
}

func (g *gw) quota(hdr map[string]string) quotaBody {
	g.t.Helper()
	r := g.do("GET", "/v1/quota", nil, hdr)
	if r.status != 200 {
		g.t.Fatalf("GET /v1/quota: %d %s", r.status, r.body)
	}
	var q quotaBody
	r.json(g.t, &q)
	return q
}

// Two API keys: each sees its own quota and usage in GET /v1/quota; a
// create or snapshot over a key's quota is 429 quota_exceeded naming it
// (with Retry-After) and makes nothing; a snapshot whose sandbox is gone
// shows as orphaned until deleted; one that could never fit the budget is
// 400 naming the field.
func TestQuotaRouteTwoKeys(t *testing.T) {
	g := newGateway(t, 0, func(o *sandbox.Options) {
		o.APIKeys = []string{testKey, testKey2}
		o.DefaultMemoryMiB = 512
		o.Budget = sandbox.Budget{MemoryMiB: 4096}
		o.Quotas = sandbox.Quotas{Sandboxes: 2, Snapshots: 1}
	})
	key2 := map[string]string{"Authorization": "Bearer " + testKey2}
	a := g.create(map[string]any{"files": map[string]string{"f": strings.Repeat("x", 100)}})
	g.create(map[string]any{"resources": map[string]any{"memory_mib": 1024}})
	r := g.do("POST", "/v1/sandboxes", map[string]any{}, key())
	if r.status != 429 || r.header.Get("Retry-After") == "" {
		t.Fatalf("over the sandboxes quota: %d Retry-After=%q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if p := r.problem(t); p.Code != "quota_exceeded" || !strings.Contains(p.Detail, "2 sandboxes") {
		t.Fatalf("problem does not name the quota: %+v", p)
	}
	if r := g.do("POST", "/v1/sandboxes", map[string]any{}, key2); r.status != 201 {
		t.Fatalf("key 2's create: %d %s", r.status, r.body)
	}

	q1, q2 := g.quota(key()), g.quota(key2)
	if q1.Limits.Sandboxes != 2 || q1.Usage.Sandboxes != 2 || q1.Usage.MemoryMib != 1536 {
		t.Fatalf("key 1: %+v", q1)
	}
	if q2.Usage.Sandboxes != 1 || q2.Usage.MemoryMib != 512 {
		t.Fatalf("key 2: %+v", q2)
	}
	if q1.Gateway != q2.Gateway || q1.Gateway.Sandboxes != 3 || q1.Gateway.MemoryMib != 2048 || q1.Gateway.MemoryBudgetMib != 4096 {
		t.Fatalf("gateway admission: %+v / %+v", q1.Gateway, q2.Gateway)
	}
	if r := g.do("GET", "/v1/quota", nil, nil); r.status != 401 {
		t.Fatalf("without a key: %d", r.status)
	}

	r = g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/snapshots", map[string]any{}, lease(a.Token))
	if r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	var sn struct {
		ID string `json:"snapshot_id"`
	}
	r.json(t, &sn)
	r = g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/snapshots", map[string]any{}, lease(a.Token))
	if p := r.problem(t); r.status != 429 || p.Code != "quota_exceeded" || !strings.Contains(p.Detail, "1 snapshots") {
		t.Fatalf("over the snapshots quota: %d %s", r.status, r.body)
	}
	if r := g.do("DELETE", "/v1/sandboxes/"+a.SandboxID, nil, lease(a.Token)); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if q := g.quota(key()); q.Usage.Snapshots != 1 || q.Usage.OrphanedSnapshots != 1 || q.Usage.OrphanedSnapshotBytes != 100 || q.Usage.Sandboxes != 1 {
		t.Fatalf("after deleting the source: %+v", q.Usage)
	}
	if q := g.quota(key2); q.Usage.Snapshots != 0 {
		t.Fatalf("key 2 sees key 1's snapshot: %+v", q.Usage)
	}
	if r := g.do("DELETE", "/v1/snapshots/"+sn.ID, nil, key()); r.status != 200 {
		t.Fatalf("delete snapshot: %d %s", r.status, r.body)
	}
	if q := g.quota(key()); q.Usage.Snapshots != 0 || q.Usage.SnapshotBytes != 0 {
		t.Fatalf("after deleting the snapshot: %+v", q.Usage)
	}

	r = g.do("POST", "/v1/sandboxes", map[string]any{"resources": map[string]any{"memory_mib": 8192}}, key2)
	if p := r.problem(t); r.status != 400 || len(p.Errors) != 1 || p.Errors[0].Field != "resources.memory_mib" {
		t.Fatalf("could never fit: %d %s", r.status, r.body)
	}
	if n := len(g.p.Snapshots()); n != 0 {
		t.Fatalf("provider holds %d snapshots", n)
	}
}
