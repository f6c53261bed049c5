package handlers

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "test-key-1"

type gw struct {
	t     *testing.T
	srv   *httptest.Server
	svc   *sandbox.Service
	p     *fake.Provider
	clock *testkit.Clock

	closedConns atomic.Int32 // connections the server closed or saw closed (newGatewayOpts)
}

// newGateway serves the handler over a real loopback HTTP server, with the
// fake provider behind the real service. Creates need testKey.
func newGateway(t *testing.T, maxBody int64, mods ...func(*sandbox.Options)) *gw {
	t.Helper()
	return newGatewayOpts(t, Options{MaxJSONBody: maxBody}, mods...)
}

// newGatewayOpts is newGateway with the handler's options ho (Service,
// PublicURL and, unless set, Logger are filled in).
func newGatewayOpts(t *testing.T, ho Options, mods ...func(*sandbox.Options)) *gw {
	t.Helper()
	g := &gw{t: t, p: fake.New(), clock: testkit.NewClock(time.Unix(1_800_000_000, 0))}
	opts := sandbox.Options{
		Provider: g.p, StateDir: t.TempDir(), APIKeys: []string{testKey}, Clock: g.clock, ReapInterval: time.Hour,
	}
	for _, m := range mods {
		m(&opts)
	}
	svc, err := sandbox.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	g.svc = svc
	ho.Service, ho.PublicURL = svc, "http://gw.example:9"
	h, err := New(ho)
	if err != nil {
		t.Fatal(err)
	}
	g.srv = httptest.NewUnstartedServer(h)
	g.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			g.closedConns.Add(1)
		}
	}
	g.srv.Start()
	t.Cleanup(func() {
		g.srv.Close()
		svc.Close()
		g.p.Close() // its sandboxes' agents (terminal tests)
	})
	return g
}

type resp struct {
	status int
	header http.Header
	body   []byte
}

func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// do sends one request; hdr holds extra headers ("Authorization" etc).
func (g *gw) do(method, path string, body any, hdr map[string]string) resp {
	g.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			g.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, g.srv.URL+path, rd)
	if err != nil {
		g.t.Fatal(err)
	}
	if rd != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		g.t.Fatal(err)
	}
	return resp{res.StatusCode, res.Header, data}
}

func key() map[string]string { return map[string]string{"Authorization": "Bearer " + testKey} }

func lease(tok string) map[string]string { return map[string]string{"X-NeMo-Gym-Sandbox-Lease": tok} }

type ref struct {
	ServerURL string         `json:"server_url"`
	SandboxID string         `json:"sandbox_id"`
	Token     string         `json:"lease_token"`
	Provider  string         `json:"provider_name"`
	Scope     string         `json:"scope"`
	Workdir   string         `json:"workdir"`
	Extra     map[string]any `json:"extra"`
}

func (g *gw) create(body any) ref {
	g.t.Helper()
	r := g.do("POST", "/v1/sandboxes", body, key())
	if r.status != 201 {
		g.t.Fatalf("create: %d %s", r.status, r.body)
	}
	var out ref
	r.json(g.t, &out)
	return out
}

func (g *gw) mint(id, tok, scope string, ttl any) ref {
	g.t.Helper()
	r := g.do("POST", "/v1/sandboxes/"+id+"/leases", map[string]any{"scope": scope, "ttl_s": ttl}, lease(tok))
	if r.status != 201 {
		g.t.Fatalf("mint: %d %s", r.status, r.body)
	}
	var out ref
	r.json(g.t, &out)
	return out
}

type problemBody struct {
	Type   string                 `json:"type"`
	Title  string                 `json:"title"`
	Status int                    `json:"status"`
	Detail string                 `json:"detail"`
	Code   string                 `json:"code"`
	Errors []providers.FieldError `json:"errors"`
}

func (r resp) problem(t *testing.T) problemBody {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("error content type %q (status %d, body %s)", ct, r.status, r.body)
	}
	var p problemBody
	r.json(t, &p)
	if p.Status != r.status || p.Detail == "" || p.Code == "" || p.Title == "" {
		t.Fatalf("incomplete problem: %s", r.body)
	}
	return p
}
