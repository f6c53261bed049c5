package handlers

import (
	"strings"
	"testing"
	"time"
)

// route is one API route for the auth matrix. need is "key" (create,
// list), "operate" or "owner". ok is the status an authorised call gets.
type route struct {
	name, method, path string
	body               any
	need               string
	ok                 int
	setup              func(g *gw, id, owner string)
}

var routes = []route{
	{"create", "POST", "/v1/sandboxes", map[string]any{}, "key", 201, nil},
	{"list", "GET", "/v1/sandboxes", nil, "key", 200, nil},
	{"get", "GET", "/v1/sandboxes/{id}", nil, "operate", 200, nil},
	{"status", "GET", "/v1/sandboxes/{id}/status", nil, "operate", 200, nil},
	{"exec", "POST", "/v1/sandboxes/{id}/exec", map[string]any{"command": "true"}, "operate", 200, nil},
	{"upload", "POST", "/v1/sandboxes/{id}/upload", map[string]any{"target_path": "a.txt", "contents_b64": "aGk="}, "operate", 200, nil},
	{"download", "GET", "/v1/sandboxes/{id}/download?remote_path=seed.txt", nil, "operate", 200, nil},
	{"put file", "PUT", "/v1/sandboxes/{id}/files?path=b.bin", "raw", "operate", 200, nil},
	{"get file", "GET", "/v1/sandboxes/{id}/files?path=seed.txt", nil, "operate", 200, nil},
	{"file info", "GET", "/v1/sandboxes/{id}/files/info?path=seed.txt", nil, "operate", 200, nil},
	{"list files", "GET", "/v1/sandboxes/{id}/files/list?path=.", nil, "operate", 200, nil},
	{"mint", "POST", "/v1/sandboxes/{id}/leases", map[string]any{"scope": "operate"}, "operate", 201, nil},
	{"release", "DELETE", "/v1/sandboxes/{id}/leases/release", nil, "operate", 200, nil},
	{"list leases", "GET", "/v1/sandboxes/{id}/leases", nil, "owner", 200, nil},
	{"revoke lease", "DELETE", "/v1/sandboxes/{id}/leases/{lease}", nil, "owner", 200, nil}, // {lease}: a fresh operate lease
	{"renew", "POST", "/v1/sandboxes/{id}/renew", map[string]any{"ttl_s": 60}, "owner", 200, nil},
	{"pause", "POST", "/v1/sandboxes/{id}/pause", nil, "owner", 200, nil},
	{"resume", "POST", "/v1/sandboxes/{id}/resume", nil, "owner", 200, func(g *gw, id, owner string) {
		if r := g.do("POST", "/v1/sandboxes/"+id+"/pause", nil, lease(owner)); r.status != 200 {
			g.t.Fatalf("pause for resume: %d %s", r.status, r.body)
		}
	}},
	{"start command", "POST", "/v1/sandboxes/{id}/commands", map[string]any{"command": "true"}, "operate", 201, nil},
	{"list commands", "GET", "/v1/sandboxes/{id}/commands", nil, "operate", 200, nil},
	{"get command", "GET", "/v1/sandboxes/{id}/commands/{cmd}", nil, "operate", 200, nil}, // {cmd}: a command started by the owner
	{"wait command", "GET", "/v1/sandboxes/{id}/commands/{cmd}/wait", nil, "operate", 200, nil},
	{"command output", "GET", "/v1/sandboxes/{id}/commands/{cmd}/output", nil, "operate", 200, nil},
	{"signal command", "POST", "/v1/sandboxes/{id}/commands/{cmd}/signal", map[string]any{"signal": "SIGTERM"}, "operate", 200, nil},
	{"delete command", "DELETE", "/v1/sandboxes/{id}/commands/{cmd}", nil, "operate", 200, nil},
	// the fake publishes no ports: an authorised caller gets 409 not_supported.
	{"endpoint", "GET", "/v1/sandboxes/{id}/endpoints/8080", nil, "operate", 409, nil},
	{"delete", "DELETE", "/v1/sandboxes/{id}", nil, "owner", 200, nil},
}

// TestAuthMatrix checks every route against every kind of credential.
func TestAuthMatrix(t *testing.T) {
	creds := []string{"none", "malformed", "wrong signature", "expired", "revoked", "other sandbox", "operate", "owner", "api key"}
	for _, rt := range routes {
		for _, cred := range creds {
			t.Run(rt.name+"/"+cred, func(t *testing.T) {
				g := newGateway(t, 0)
				a := g.create(map[string]any{"files": map[string]string{"seed.txt": "seed"}, "ports": []int{8080}})
				b := g.create(map[string]any{})
				var hdr map[string]string
				switch cred {
				case "none":
				case "malformed":
					hdr = lease("not-a-token")
				case "wrong signature":
					tok := a.Token
					last := tok[len(tok)-1]
					repl := byte('A')
					if last == 'A' {
						repl = 'B'
					}
					hdr = lease(tok[:len(tok)-1] + string(repl))
				case "expired":
					hdr = lease(g.mint(a.SandboxID, a.Token, "operate", 1).Token)
					g.clock.Advance(2 * time.Second)
				case "revoked":
					r := g.mint(a.SandboxID, a.Token, "owner", nil)
					if res := g.do("DELETE", "/v1/sandboxes/"+a.SandboxID+"/leases/release", nil, lease(r.Token)); res.status != 200 {
						t.Fatalf("release: %d %s", res.status, res.body)
					}
					hdr = lease(r.Token)
				case "other sandbox":
					hdr = lease(b.Token)
				case "operate":
					hdr = map[string]string{"X-Sandbox-Lease": g.mint(a.SandboxID, a.Token, "operate", nil).Token}
				case "owner":
					hdr = map[string]string{"Authorization": "Bearer " + a.Token}
				case "api key":
					hdr = key()
				}
				if rt.setup != nil {
					rt.setup(g, a.SandboxID, a.Token)
				}
				want := expect(rt, cred)
				body := rt.body
				if body == "raw" {
					hdr2 := map[string]string{"Content-Type": "application/octet-stream"}
					for k, v := range hdr {
						hdr2[k] = v
					}
					hdr, body = hdr2, []byte("raw bytes")
				}
				path := strings.ReplaceAll(rt.path, "{id}", a.SandboxID)
				if strings.Contains(path, "{lease}") {
					path = strings.ReplaceAll(path, "{lease}", leaseID(g.mint(a.SandboxID, a.Token, "operate", nil)))
				}
				if strings.Contains(path, "{cmd}") {
					path = strings.ReplaceAll(path, "{cmd}", g.startCommand(a.SandboxID, a.Token, map[string]any{"command": "true"}).CommandID)
				}
				r := g.do(rt.method, path, body, hdr)
				if r.status != want {
					t.Fatalf("%s %s with %s: status %d, want %d (%s)", rt.method, rt.path, cred, r.status, want, r.body)
				}
				if r.status >= 400 {
					r.problem(t)
				}
			})
		}
	}
}

func expect(rt route, cred string) int {
	switch cred {
	case "none", "malformed", "wrong signature", "expired", "revoked":
		return 401
	}
	if rt.need == "key" {
		if cred == "api key" {
			return rt.ok
		}
		return 401 // a lease token is not an API key
	}
	switch {
	case cred == "other sandbox":
		return 403
	case cred == "operate" && rt.need == "owner":
		return 403
	case cred == "api key" && rt.name == "release":
		return 409 // an API key holds no lease to release
	}
	return rt.ok
}

// TestUnknownSandboxAfterVerify: 404 comes only after the token verified.
func TestUnknownSandboxAfterVerify(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	other := "sbx-" + strings.Repeat("a", 20)
	for _, c := range []struct {
		hdr  map[string]string
		want int
	}{
		{nil, 401},
		{lease("junk"), 401},
		{lease(a.Token), 403}, // a valid token for another id says nothing about whether `other` exists
		{key(), 404},
	} {
		if r := g.do("GET", "/v1/sandboxes/"+other, nil, c.hdr); r.status != c.want {
			t.Errorf("%v: %d, want %d", c.hdr, r.status, c.want)
		}
	}
	if r := g.do("DELETE", "/v1/sandboxes/"+a.SandboxID, nil, lease(a.Token)); r.status != 200 {
		t.Fatalf("delete: %d", r.status)
	}
	for i, want := range []int{404, 404} {
		r := g.do("DELETE", "/v1/sandboxes/"+a.SandboxID, nil, lease(a.Token))
		if r.status != want {
			t.Fatalf("delete #%d after delete: %d, want %d", i+2, r.status, want)
		}
		if p := r.problem(t); !strings.Contains(p.Detail, a.SandboxID) {
			t.Fatalf("404 detail %q", p.Detail)
		}
	}
}
