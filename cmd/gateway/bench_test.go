package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	p := benchLocal(b)
	return serveInProcess(b, p), p
}

// benchLocal is a local provider whose sandboxes are deleted after the
// benchmark (registered first, so it runs last: sandboxes outlive the
// gateway by design, but not the benchmark).
func benchLocal(b *testing.B) *local.Local {
	b.Helper()
	p, err := local.New(local.Options{StateDir: b.TempDir(), InitBinary: agentBin()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx := context.Background()
		owned, _ := p.List(ctx)
		for _, o := range owned {
			if err := p.Delete(ctx, o.ID); err != nil {
				b.Errorf("delete %s: %v", o.ID, err)
			}
		}
	})
	return p
}

// serveInProcess puts service and handlers over p on a loopback HTTP
// server; cleanup closes them and p.
func serveInProcess(b *testing.B, p providers.Provider) *httptest.Server {
	srv, _ := serveWith(b, p, nil)
	return srv
}

// serveWith is serveInProcess with the service's options changed by mod
// (when not nil); it returns the service too.
func serveWith(b *testing.B, p providers.Provider, mod func(*sandbox.Options)) (*httptest.Server, *sandbox.Service) {
	b.Helper()
	var store sandbox.Store
	if k, ok := p.(*kubernetes.Kubernetes); ok {
		store = k.Store() // as main does
	}
	opts := sandbox.Options{Provider: p, Store: store, StateDir: b.TempDir(), AllowAnonymous: true, MaxSandboxes: 1000}
	if mod != nil {
		mod(&opts)
	}
	svc, err := sandbox.New(context.Background(), opts)
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
	return srv, svc
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

// BenchmarkCreateGroupVolume alternates, through the whole gateway on
// the local provider, a plain create with one that joins a group (which
// already has a member) and mounts a volume, and reports both p50s and
// their ratio (issue 23's target: at most 1.2).
func BenchmarkCreateGroupVolume(b *testing.B) {
	srv, _ := benchGateway(b)
	c := srv.Client()
	post(b, c, srv.URL+"/v1/volumes", "", `{"name":"bench","size_gib":0.0625}`)
	b.Cleanup(func() { // first, while the gateway is up: its mount goes with it
		req, _ := http.NewRequest("DELETE", srv.URL+"/v1/volumes/bench", nil)
		if res, err := c.Do(req); err != nil || res.StatusCode != 200 {
			b.Errorf("delete volume: %v %v", res, err)
		} else {
			res.Body.Close()
		}
	})
	create := func(body string) benchRef {
		var ref benchRef
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", body), &ref)
		return ref
	}
	first := create(`{"group":"bench","hostname":"first"}`)
	var plain, grouped []time.Duration
	for b.Loop() {
		t0 := time.Now()
		p := create(`{}`)
		t1 := time.Now()
		g := create(`{"group":"bench","volumes":[{"volume":"bench","mount_path":"/data"}]}`)
		t2 := time.Now()
		plain, grouped = append(plain, t1.Sub(t0)), append(grouped, t2.Sub(t1))
		b.StopTimer()
		benchDelete(c, srv.URL, p)
		benchDelete(c, srv.URL, g)
		b.StartTimer()
	}
	b.StopTimer()
	benchDelete(c, srv.URL, first)
	pp, gp := pct(plain, 0.5), pct(grouped, 0.5)
	b.ReportMetric(pp, "plain-p50-ms")
	b.ReportMetric(gp, "group-volume-p50-ms")
	b.ReportMetric(gp/pp, "group-volume/plain")
}

// poolBench alternates, through the whole gateway over HTTP, a create +
// first exec of `true` that a warm pool serves with one that it does not
// (another workdir: a cold create), waiting (untimed) for the pool to be
// full before each round, and reports both p50s and their ratio.
func poolBench(b *testing.B, p providers.Provider, image string) {
	const size = 4
	srv, svc := serveWith(b, p, func(o *sandbox.Options) {
		o.Pools = []sandbox.PoolSpec{{Image: image, Count: size}}
	})
	key := sandbox.PoolSpec{Image: image}.Key()
	c := srv.Client()
	createExec := func(workdir string) (benchRef, map[string]any) {
		var ref struct {
			benchRef
			Extra map[string]any `json:"extra"`
		}
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{"image":"`+image+`","workdir":"`+workdir+`"}`), &ref)
		post(b, c, srv.URL+"/v1/sandboxes/"+ref.ID+"/exec", ref.Tok, `{"command":"true"}`)
		return ref.benchRef, ref.Extra
	}
	var warm, cold []time.Duration
	for b.Loop() {
		b.StopTimer()
		for deadline := time.Now().Add(2 * time.Minute); svc.PoolReady()[key] < size; {
			if time.Now().After(deadline) {
				b.Fatal("the pool did not fill in 2 minutes")
			}
			poll := time.NewTimer(5 * time.Millisecond)
			<-poll.C
		}
		b.StartTimer()
		t0 := time.Now()
		w, extra := createExec("/workspace")
		t1 := time.Now()
		k, _ := createExec("/cold")
		t2 := time.Now()
		if extra["warm_pool"] != true {
			b.Fatalf("the pool did not serve the create: %v", extra)
		}
		warm, cold = append(warm, t1.Sub(t0)), append(cold, t2.Sub(t1))
		b.StopTimer()
		benchDelete(c, srv.URL, w)
		benchDelete(c, srv.URL, k)
		b.StartTimer()
	}
	g, k := pct(warm, 0.5), pct(cold, 0.5)
	b.ReportMetric(g, "pool-p50-ms")
	b.ReportMetric(pct(warm, 0.99), "pool-p99-ms")
	b.ReportMetric(k, "cold-p50-ms")
	b.ReportMetric(k/g, "cold/pool")
}

// BenchmarkPoolCreateFirstExec: poolBench on the local provider.
func BenchmarkPoolCreateFirstExec(b *testing.B) {
	poolBench(b, benchLocal(b), "")
}

// interleave runs gateway and baseline alternately in b's loop and
// reports the gateway's p50 and p99, the baseline's p50 (as name-p50-ms)
// and baseline/gateway (as name/gateway).
func interleave(b *testing.B, name string, gateway, baseline func()) {
	interleaveUndo(b, name, func() func() { gateway(); return nil }, func() func() { baseline(); return nil })
}

// interleaveUndo is interleave for steps that leave something to undo:
// each returns how (or nil), which runs untimed.
func interleaveUndo(b *testing.B, name string, gateway, baseline func() (undo func())) {
	var viaGateway, viaBase []time.Duration
	for b.Loop() {
		t0 := time.Now()
		undoG := gateway()
		t1 := time.Now()
		undoB := baseline()
		t2 := time.Now()
		viaGateway, viaBase = append(viaGateway, t1.Sub(t0)), append(viaBase, t2.Sub(t1))
		b.StopTimer()
		for _, undo := range []func(){undoG, undoB} {
			if undo != nil {
				undo()
			}
		}
		b.StartTimer()
	}
	g, k := pct(viaGateway, 0.5), pct(viaBase, 0.5)
	b.ReportMetric(g, "gateway-p50-ms")
	b.ReportMetric(pct(viaGateway, 0.99), "gateway-p99-ms")
	b.ReportMetric(k, name+"-p50-ms")
	b.ReportMetric(k/g, name+"/gateway")
}

// BenchmarkLocalFork forks (count 1: snapshot + create, ready) a local
// sandbox with 1 GiB written and one with a few bytes, alternately, and
// reports both p50s and their ratio: a fork is O(1) in what the source
// wrote (issue 12: under 100 ms regardless of size). The data is on disk
// (synced) before the forks: a snapshot first writes back what is not.
func BenchmarkLocalFork(b *testing.B) {
	srv, _ := benchGateway(b)
	c := srv.Client()
	source := func(cmd string) benchRef {
		var r benchRef
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{}`), &r)
		post(b, c, srv.URL+"/v1/sandboxes/"+r.ID+"/exec", r.Tok, `{"command":"`+cmd+` && sync","timeout_s":120}`)
		return r
	}
	big := source("dd if=/dev/zero of=/workspace/big bs=1M count=1024 status=none")
	small := source("echo small > /workspace/small")
	fork := func(src benchRef) func() func() {
		return func() func() {
			var out struct{ Sandboxes []benchRef }
			json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes/"+src.ID+"/fork", src.Tok, `{"count":1}`), &out)
			return func() {
				for _, f := range out.Sandboxes {
					benchDelete(c, srv.URL, f)
				}
			}
		}
	}
	interleaveUndo(b, "small", fork(big), fork(small))
}

// BenchmarkInitBinary alternates local creates (provider calls, ready to
// exec) whose setup and init run from the sandgate-agent binary with
// creates that re-execute the running (test) binary, which links every
// provider: a process of it spends most of its start initialising
// packages it does not use.
func BenchmarkInitBinary(b *testing.B) {
	mk := func(bin string) *local.Local {
		p, err := local.New(local.Options{StateDir: b.TempDir(), InitBinary: bin})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		return p
	}
	agent, self := mk(agentBin()), mk("")
	ctx := context.Background()
	n := 0
	create := func(p *local.Local) func() func() {
		return func() func() {
			n++
			id := fmt.Sprintf("bench-init-%d", n)
			if _, err := p.Create(ctx, providers.CreateSpec{ID: id, Workdir: "/workspace"}); err != nil {
				b.Fatal(err)
			}
			return func() { p.Delete(ctx, id) }
		}
	}
	interleaveUndo(b, "self", create(agent), create(self))
}
