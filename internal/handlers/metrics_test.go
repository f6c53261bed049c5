package handlers

import (
	"net/url"
	"testing"
	"time"
)

// TestSandboxMetrics: GET /v1/sandboxes/{id}/metrics answers the samples
// of the sandbox's agent to any lease, keeps those within start..end, and
// refuses a bad window and a missing credential.
func TestSandboxMetrics(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	op := g.mint(a.SandboxID, a.Token, "operate", nil)
	base := "/v1/sandboxes/" + a.SandboxID + "/metrics"
	var got struct {
		Samples []struct {
			Time                                             time.Time
			CPUCount                                         int     `json:"cpu_count"`
			CPUUsedPct                                       float64 `json:"cpu_used_pct"`
			MemUsed, MemTotal, MemCache, DiskUsed, DiskTotal int64
		}
	}
	r := g.do("GET", base, nil, lease(op.Token))
	r.json(t, &got)
	if r.status != 200 || len(got.Samples) != 1 {
		t.Fatalf("metrics: %d %s", r.status, r.body)
	}
	if s := got.Samples[0]; s.CPUCount < 1 || s.CPUUsedPct < 0 || s.CPUUsedPct > 100 || s.Time.IsZero() {
		t.Fatalf("sample: %s", r.body)
	}
	future := url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339))
	if r = g.do("GET", base+"?start="+future, nil, lease(op.Token)); r.status != 200 || string(r.body) != "{\"samples\":[]}\n" {
		t.Fatalf("start in an hour: %d %s", r.status, r.body)
	}
	past := url.QueryEscape(time.Now().Add(-time.Hour).Format(time.RFC3339))
	for q, want := range map[string]int{
		"?start=" + future + "&end=" + past: 400,
		"?start=yesterday":                  400,
	} {
		if r = g.do("GET", base+q, nil, lease(op.Token)); r.status != want {
			t.Errorf("%s: %d %s, want %d", q, r.status, r.body, want)
		}
	}
	if r = g.do("GET", base, nil, nil); r.status != 401 {
		t.Errorf("no credential: %d %s", r.status, r.body)
	}
}
