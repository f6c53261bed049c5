package handlers

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

// portsFake is the fake provider plus published ports: every declared
// port is served by one loopback test server.
type portsFake struct {
	*fake.Provider
	url string
}

func (p portsFake) Endpoint(ctx context.Context, id string, port int) (providers.Endpoint, error) {
	return providers.Endpoint{URL: p.url, Headers: map[string]string{"X-Upstream-Port": "yes"}}, nil
}

// TestProxy: HTTP and WebSocket through /proxy/{port}/, only for declared
// ports and valid leases, with the gateway's credentials stripped.
func TestProxy(t *testing.T) {
	type seen struct{ path, query, lease, auth, extra string }
	got := make(chan seen, 10)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				return
			}
			defer c.CloseNow()
			typ, b, err := c.Read(r.Context())
			if err == nil {
				c.Write(r.Context(), typ, append([]byte("echo:"), b...))
			}
			c.Close(websocket.StatusNormalClosure, "")
			return
		}
		got <- seen{r.URL.Path, r.URL.RawQuery, r.Header.Get("X-Sandbox-Lease") + r.Header.Get("X-NeMo-Gym-Sandbox-Lease"), r.Header.Get("Authorization"), r.Header.Get("X-Upstream-Port")}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("X-From", "sandbox")
		w.WriteHeader(http.StatusTeapot)
		w.Write(append([]byte(r.Method+" "), body...))
	}))
	defer upstream.Close()

	g := &gw{t: t, p: fake.New(), clock: testkit.NewClock(time.Now())}
	svc, err := sandbox.New(context.Background(), sandbox.Options{
		Provider: portsFake{g.p, upstream.URL}, StateDir: t.TempDir(), APIKeys: []string{testKey}, ReapInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	g.srv, g.svc = httptest.NewServer(h), svc
	defer func() { g.srv.Close(); svc.Close() }()

	a := g.create(map[string]any{"ports": []int{8080}})
	other := g.create(map[string]any{})
	base := "/v1/sandboxes/" + a.SandboxID + "/proxy/8080"

	r := g.do("POST", base+"/api/items?q=1&lease=zzz&x=2", "payload", lease(a.Token))
	if r.status != http.StatusTeapot || string(r.body) != "POST payload" || r.header.Get("X-From") != "sandbox" {
		t.Fatalf("proxied POST: %d %q", r.status, r.body)
	}
	if s := <-got; s.path != "/api/items" || s.query != "q=1&x=2" || s.lease != "" || s.auth != "" || s.extra != "yes" {
		t.Fatalf("upstream saw %+v", s)
	}
	// A lease in the query (browsers); the client's own Authorization
	// header goes through when it was not the credential.
	r = g.do("GET", base+"/?lease="+a.Token, nil, map[string]string{"Authorization": "Basic app-cred"})
	if r.status != http.StatusTeapot {
		t.Fatalf("query lease: %d %s", r.status, r.body)
	}
	if s := <-got; s.path != "/" || s.query != "" || s.auth != "Basic app-cred" {
		t.Fatalf("upstream saw %+v", s)
	}

	// Every credential of the gateway is stripped, whether or not it was
	// the one used: an API key beside a lease, another sandbox's lease,
	// a key as Basic's password, a lease as a bare value.
	for _, auth := range []string{
		"Bearer " + testKey,
		"bearer " + other.Token,
		"Basic " + base64.StdEncoding.EncodeToString([]byte("user:"+testKey)),
		a.Token,
	} {
		r := g.do("GET", base+"/cred", nil, map[string]string{"X-Sandbox-Lease": a.Token, "X-NeMo-Gym-Sandbox-Lease": a.Token, "Authorization": auth})
		if r.status != http.StatusTeapot {
			t.Fatalf("Authorization %.20q: %d %s", auth, r.status, r.body)
		}
		if s := <-got; s.auth != "" || s.lease != "" {
			t.Fatalf("Authorization %.20q: upstream saw %+v", auth, s)
		}
	}

	for _, c := range []struct {
		path string
		hdr  map[string]string
		want int
	}{
		{base + "/x", nil, 401},
		{base + "/x", lease("junk"), 401},
		{base + "/x", lease(other.Token), 403},
		{"/v1/sandboxes/" + a.SandboxID + "/proxy/9090/x", lease(a.Token), 404}, // not declared
		{"/v1/sandboxes/" + a.SandboxID + "/proxy/0/x", lease(a.Token), 400},
		{"/v1/sandboxes/" + a.SandboxID + "/proxy/http/x", lease(a.Token), 400},
	} {
		if r := g.do("GET", c.path, nil, c.hdr); r.status != c.want {
			t.Errorf("GET %s: %d, want %d (%s)", c.path, r.status, c.want, r.body)
		} else {
			r.problem(t)
		}
	}
	if len(got) != 0 {
		t.Fatal("a refused request reached the sandbox")
	}

	// WebSocket through the proxy.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(g.srv.URL, "http") + base + "/ws"
	c, _, err := websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {a.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.Write(ctx, websocket.MessageText, []byte("hi"))
	if _, b, err := c.Read(ctx); err != nil || string(b) != "echo:hi" {
		t.Fatalf("websocket through the proxy: %q %v", b, err)
	}

	// Nothing listening: 502 problem.
	upstream.Close()
	if r := g.do("GET", base+"/", nil, lease(a.Token)); r.status != http.StatusBadGateway {
		t.Fatalf("dead upstream: %d", r.status)
	} else {
		r.problem(t)
	}
}
