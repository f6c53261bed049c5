package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/handlers"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes"
	"github.com/sandgate/sandgate/internal/providers/local"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// benchGateway wires the real stack in-process on the local provider:
// service, handlers, a loopback HTTP server.
func benchGateway(b *testing.B) (*httptest.Server, *local.Local) {
	b.Helper()
	p, err := local.New(local.Options{StateDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	// Registered first, so it runs last: sandboxes outlive the gateway by
	// design, but not the benchmark.
	b.Cleanup(func() {
		ctx := context.Background()
		owned, _ := p.List(ctx)
		for _, o := range owned {
			if err := p.Delete(ctx, o.ID); err != nil {
				b.Errorf("delete %s: %v", o.ID, err)
			}
		}
	})
	return serveInProcess(b, p), p
}

// serveInProcess puts service and handlers over p on a loopback HTTP
// server; cleanup closes them and p.
func serveInProcess(b *testing.B, p providers.Provider) *httptest.Server {
	b.Helper()
	var store sandbox.Store
	if k, ok := p.(*kubernetes.Kubernetes); ok {
		store = k.Store() // as main does
	}
	svc, err := sandbox.New(context.Background(), sandbox.Options{Provider: p, Store: store, StateDir: b.TempDir(), AllowAnonymous: true, MaxSandboxes: 1000})
	if err != nil {
		b.Fatal(err)
	}
	h, err := handlers.New(handlers.Options{Service: svc})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(h)
	b.Cleanup(func() {
		srv.Close()
		svc.Close()
		p.Close()
	})
	return srv
}

func post(b *testing.B, c *http.Client, url, tok, body string) []byte {
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("X-Sandbox-Lease", tok)
	}
	res, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		b.Fatalf("%s: %d %s", url, res.StatusCode, data)
	}
	return data
}

func pct(d []time.Duration, p float64) float64 {
	slices.Sort(d)
	return float64(d[int(float64(len(d)-1)*p)].Microseconds()) / 1000
}

// BenchmarkExecTrue runs `true` in one local sandbox, alternating an HTTP
// exec through the whole gateway with the same exec called on the provider
// directly, and reports both p50s and their ratio (SPEC §11: HTTP p50
// under 5 ms and at most 1.5x the direct call).
func BenchmarkExecTrue(b *testing.B) {
	srv, p := benchGateway(b)
	c := srv.Client()
	var ref struct {
		ID  string `json:"sandbox_id"`
		Tok string `json:"lease_token"`
	}
	json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{}`), &ref)
	url := srv.URL + "/v1/sandboxes/" + ref.ID + "/exec"
	ctx := context.Background()
	req := providers.ExecRequest{Command: "true", Cwd: "/workspace", Timeout: time.Minute, MaxOutput: 1 << 20}
	var viaHTTP, direct []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		post(b, c, url, ref.Tok, `{"command":"true"}`)
		t1 := time.Now()
		if _, err := p.Exec(ctx, ref.ID, req); err != nil {
			b.Fatal(err)
		}
		viaHTTP, direct = append(viaHTTP, t1.Sub(t0)), append(direct, time.Since(t1))
	}
	b.StopTimer()
	h, d := pct(viaHTTP, 0.5), pct(direct, 0.5)
	b.ReportMetric(h, "http-p50-ms")
	b.ReportMetric(d, "provider-p50-ms")
	b.ReportMetric(h/d, "ratio")
	b.ReportMetric(pct(viaHTTP, 0.99), "http-p99-ms")
}

// BenchmarkCreateDelete creates and deletes a local sandbox over HTTP.
func BenchmarkCreateDelete(b *testing.B) {
	srv, _ := benchGateway(b)
	c := srv.Client()
	var creates, deletes []time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		var ref struct {
			ID  string `json:"sandbox_id"`
			Tok string `json:"lease_token"`
		}
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{}`), &ref)
		t1 := time.Now()
		req, _ := http.NewRequest("DELETE", srv.URL+"/v1/sandboxes/"+ref.ID, nil)
		req.Header.Set("X-Sandbox-Lease", ref.Tok)
		res, err := c.Do(req)
		if err != nil || res.StatusCode != 200 {
			b.Fatalf("delete: %v", err)
		}
		res.Body.Close()
		creates, deletes = append(creates, t1.Sub(t0)), append(deletes, time.Since(t1))
	}
	b.StopTimer()
	b.ReportMetric(pct(creates, 0.5), "create-p50-ms")
	b.ReportMetric(pct(deletes, 0.5), "delete-p50-ms")
}
