package handlers

import (
	"testing"

	"github.com/sandgate/sandgate/internal/pty"
)

// TestPTYSessionLimits: past the per-sandbox limit a create gets 429, past
// the overall one 503 with Retry-After; deleting a session frees its slot.
func TestPTYSessionLimits(t *testing.T) {
	e := newPtyEnv(t, pty.Options{MaxPerSandbox: 1, MaxSessions: 2})
	first := e.session(map[string]any{"command": "sleep 100"})
	r := e.do("POST", "/v1/sandboxes/"+e.id+"/pty", map[string]any{"command": "sleep 100"}, lease(e.token))
	if r.status != 429 || r.header.Get("Retry-After") == "" {
		t.Fatalf("second session in one sandbox: %d %s", r.status, r.body)
	}
	r.problem(t)
	if d := e.do("DELETE", "/v1/sandboxes/"+e.id+"/pty/"+first, nil, lease(e.token)); d.status != 200 {
		t.Fatalf("delete session: %d %s", d.status, d.body)
	}
	e.session(map[string]any{"command": "sleep 100"})
	other := e.create(map[string]any{})
	r = e.do("POST", "/v1/sandboxes/"+other.SandboxID+"/pty", map[string]any{"command": "sleep 100"}, lease(other.Token))
	if r.status != 201 {
		t.Fatalf("session in a second sandbox: %d %s", r.status, r.body)
	}
	third := e.create(map[string]any{})
	r = e.do("POST", "/v1/sandboxes/"+third.SandboxID+"/pty", map[string]any{"command": "sleep 100"}, lease(third.Token))
	if r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("past the overall limit: %d %s", r.status, r.body)
	}
	r.problem(t)
	for _, id := range []string{other.SandboxID, third.SandboxID} {
		e.do("DELETE", "/v1/sandboxes/"+id, nil, key())
	}
}
