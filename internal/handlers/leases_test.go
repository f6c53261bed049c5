package handlers

import (
	"strings"
	"testing"
	"time"
)

type leaseRow struct {
	LeaseID   string     `json:"lease_id"`
	Scope     string     `json:"scope"`
	ParentID  *string    `json:"parent_id"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"`
}

func leaseID(r ref) string { id, _ := r.Extra["lease_id"].(string); return id }

// forged is tok with the last character of its MAC changed. (A token
// with a valid MAC for a lease never minted is TestRevokeRefusals'.)
func forged(tok string) string {
	last := byte('A')
	if tok[len(tok)-1] == last {
		last = 'B'
	}
	return tok[:len(tok)-1] + string(last)
}

// TestLeaseTreeOverHTTP: OP mints CH, CH mints CH2, over the wire. The
// owner lists them (scope, parent, expiry, never a token) and revokes CH's
// subtree; releasing OP ends the rest; an operate lease can neither list
// nor revoke; ids that are no live lease of the sandbox are 404 (400 when
// malformed) and change nothing; a forged token is 401.
func TestLeaseTreeOverHTTP(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	b := g.create(map[string]any{})
	base := "/v1/sandboxes/" + a.SandboxID
	g.clock.Advance(time.Second) // listed oldest first
	op := g.mint(a.SandboxID, a.Token, "operate", 600)
	g.clock.Advance(time.Second)
	ch := g.mint(a.SandboxID, op.Token, "operate", nil)
	g.clock.Advance(time.Second)
	ch2 := g.mint(a.SandboxID, ch.Token, "operate", nil)

	list := func(hdr map[string]string) []leaseRow {
		t.Helper()
		r := g.do("GET", base+"/leases", nil, hdr)
		if r.status != 200 {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
		for _, tok := range []string{a.Token, op.Token, ch.Token, ch2.Token, "lease_token"} {
			if strings.Contains(string(r.body), tok) {
				t.Fatalf("the list shows a token: %s", r.body)
			}
		}
		var out struct{ Leases []leaseRow }
		r.json(t, &out)
		return out.Leases
	}
	rows := list(lease(a.Token))
	opExp := time.Unix(1_800_000_000+1+600, 0).UTC()
	want := []struct {
		id, scope, parent string
		expires           *time.Time
	}{
		{leaseID(a), "owner", "", nil},
		{leaseID(op), "operate", leaseID(a), &opExp},
		{leaseID(ch), "operate", leaseID(op), &opExp}, // no ttl_s: OP's expiry
		{leaseID(ch2), "operate", leaseID(ch), &opExp},
	}
	if len(rows) != len(want) {
		t.Fatalf("listed %+v", rows)
	}
	for i, w := range want {
		r := rows[i]
		parent := ""
		if r.ParentID != nil {
			parent = *r.ParentID
		}
		if r.LeaseID != w.id || r.Scope != w.scope || parent != w.parent || (r.ExpiresAt == nil) != (w.expires == nil) ||
			(w.expires != nil && !r.ExpiresAt.Equal(*w.expires)) || r.CreatedAt.IsZero() {
			t.Errorf("row %d: %+v, want %+v", i, r, w)
		}
	}
	if got := list(key()); len(got) != 4 {
		t.Fatalf("the creating API key lists %d leases", len(got))
	}

	// Refused: nothing changes.
	for _, c := range []struct {
		name, method, path string
		hdr                map[string]string
		want               int
	}{
		{"operate lists", "GET", base + "/leases", lease(op.Token), 403},
		{"operate revokes", "DELETE", base + "/leases/" + leaseID(ch2), lease(op.Token), 403},
		{"unknown id", "DELETE", base + "/leases/ls-aaaaaaaaaaaaaaaa", lease(a.Token), 404},
		{"another sandbox's lease", "DELETE", base + "/leases/" + leaseID(b), lease(a.Token), 404},
		{"malformed id", "DELETE", base + "/leases/ls-NOT-AN-ID", lease(a.Token), 400},
		{"forged", "GET", base + "/leases", lease(forged(a.Token)), 401},
		{"no credentials", "DELETE", base + "/leases/" + leaseID(ch), nil, 401},
		{"another sandbox's owner", "DELETE", base + "/leases/" + leaseID(ch), lease(b.Token), 403},
	} {
		r := g.do(c.method, c.path, nil, c.hdr)
		if r.status != c.want {
			t.Fatalf("%s: %d, want %d (%s)", c.name, r.status, c.want, r.body)
		}
		r.problem(t)
	}
	if got := list(lease(a.Token)); len(got) != 4 {
		t.Fatalf("refused calls changed the leases: %+v", got)
	}
	// release is its own route, never a lease id: an API key has no lease to release.
	if r := g.do("DELETE", base+"/leases/release", nil, key()); r.status != 409 {
		t.Fatalf("release with an API key: %d %s", r.status, r.body)
	}

	r := g.do("DELETE", base+"/leases/"+leaseID(ch), nil, lease(a.Token))
	if r.status != 200 || strings.TrimSpace(string(r.body)) != `{"revoked":2}` {
		t.Fatalf("revoke CH: %d %s", r.status, r.body)
	}
	wantHTTPRevoked(t, g, a.SandboxID, ch, ch2)
	if r := g.do("GET", base+"/status", nil, lease(op.Token)); r.status != 200 {
		t.Fatalf("OP after CH's revocation: %d", r.status)
	}

	r = g.do("DELETE", base+"/leases/release", nil, lease(op.Token))
	if r.status != 200 || !strings.Contains(string(r.body), `"remaining_leases":1`) {
		t.Fatalf("release OP: %d %s", r.status, r.body)
	}
	wantHTTPRevoked(t, g, a.SandboxID, op)
	if got := list(lease(a.Token)); len(got) != 1 || got[0].LeaseID != leaseID(a) {
		t.Fatalf("left: %+v", got)
	}
}

// TestReleaseSubtreeOverHTTP: releasing OP ends CH and CH2 on every route.
func TestReleaseSubtreeOverHTTP(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	op := g.mint(a.SandboxID, a.Token, "operate", nil)
	ch := g.mint(a.SandboxID, op.Token, "operate", nil)
	ch2 := g.mint(a.SandboxID, ch.Token, "operate", nil)
	r := g.do("DELETE", "/v1/sandboxes/"+a.SandboxID+"/leases/release", nil, lease(op.Token))
	if r.status != 200 || !strings.Contains(string(r.body), `"remaining_leases":1`) {
		t.Fatalf("release OP: %d %s", r.status, r.body)
	}
	wantHTTPRevoked(t, g, a.SandboxID, op, ch, ch2)
	if r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/exec", map[string]any{"command": "true"}, lease(a.Token)); r.status != 200 {
		t.Fatalf("the owner after the release: %d %s", r.status, r.body)
	}
}

// wantHTTPRevoked checks that each ref's token gets 401 on exec, mint,
// status and release.
func wantHTTPRevoked(t *testing.T, g *gw, id string, refs ...ref) {
	t.Helper()
	base := "/v1/sandboxes/" + id
	for _, rf := range refs {
		for _, c := range []struct {
			method, path string
			body         any
		}{
			{"POST", base + "/exec", map[string]any{"command": "true"}},
			{"POST", base + "/leases", map[string]any{"scope": "operate"}},
			{"GET", base + "/status", nil},
			{"DELETE", base + "/leases/release", nil},
		} {
			if r := g.do(c.method, c.path, c.body, lease(rf.Token)); r.status != 401 {
				t.Fatalf("%s %s with revoked lease %s: %d %s", c.method, c.path, leaseID(rf), r.status, r.body)
			}
		}
	}
}
