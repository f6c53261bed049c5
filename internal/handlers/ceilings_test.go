package handlers

import (
	"context"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

var testCeilings = sandbox.Ceilings{MemoryMiB: 24042, CPU: 4, DiskGiB: 70, TTL: 24 * time.Hour, EnvBytes: 64 << 10, MetadataBytes: 64 << 10, FilesBytes: 16 << 20, Files: 1024}

// TestCreateOverCeilingsHTTP: the create (memory_mib 1e8, disk_gib
// 5000, cpu 1000, ttl_s 1e9) is one 400 problem naming every field and
// its ceiling, and creates nothing; so is a ttl_s too long for a Duration
// (not "negative"). Renew and mint over the TTL ceiling are 400 too.
func TestCreateOverCeilingsHTTP(t *testing.T) {
	g := newGateway(t, 64<<20, func(o *sandbox.Options) { o.Ceilings = testCeilings })
	for _, ttl := range []string{"1e9", "1e12", "0"} {
		r := g.do("POST", "/v1/sandboxes", `{"ttl_s": `+ttl+`, "resources": {"memory_mib": 100000000, "disk_gib": 5000, "cpu": 1000}}`, key())
		if r.status != 400 {
			t.Fatalf("ttl_s %s: status %d: %s", ttl, r.status, r.body)
		}
		p := r.problem(t)
		if p.Code != "invalid_input" {
			t.Errorf("code %q", p.Code)
		}
		note := " (the gateway's ceiling)"
		testkit.WantFields(t, p.Errors, map[string]string{
			"ttl_s":                "must be at most 86400" + note,
			"resources.memory_mib": "must be at most 24042" + note,
			"resources.disk_gib":   "must be at most 70" + note,
			"resources.cpu":        "must be at most 4" + note,
		})
	}
	if r := g.do("GET", "/v1/sandboxes", nil, key()); r.status != 200 || strings.Contains(string(r.body), "sbx-") {
		t.Fatalf("list after refused creates: %d %s", r.status, r.body)
	}
	if owned, err := g.p.List(context.Background()); err != nil || len(owned) != 0 {
		t.Fatalf("refused creates left %d sandboxes (%v)", len(owned), err)
	}

	a := g.create(map[string]any{"ttl_s": 86400, "resources": map[string]any{"memory_mib": 24042, "cpu": 4, "disk_gib": 70}})
	for _, path := range []string{"/renew", "/leases"} {
		r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+path, `{"ttl_s": 86401}`, lease(a.Token))
		if r.status != 400 {
			t.Fatalf("%s over the TTL ceiling: %d %s", path, r.status, r.body)
		}
		testkit.WantFields(t, r.problem(t).Errors, map[string]string{"ttl_s": "must be at most 86400 (the gateway's ceiling)"})
	}
}

// TestMetadataCeilingHoldsNothing: three creates with 4 MiB of metadata
// each (under the JSON body cap, which is not what this tests) are each
// refused naming metadata and its ceiling, and the gateway keeps none of
// it: its live heap afterwards is what it was (before the ceiling, it
// kept all 12 MiB). The 3 x 40 MiB takes minutes to decode under
// -race on a loaded CI machine; TestCeilingsGateway sends it to a real
// gateway.
func TestMetadataCeilingHoldsNothing(t *testing.T) {
	g := newGateway(t, 64<<20, func(o *sandbox.Options) { o.Ceilings = testCeilings })
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	before := heap()
	const size = 4 << 20
	for range 3 {
		head, tail := `{"metadata": {"blob": "`, `"}}`
		// Streamed: the test itself holds none of it.
		body := io.MultiReader(strings.NewReader(head), io.LimitReader(repeatByte('x'), size), strings.NewReader(tail))
		req, err := http.NewRequest("POST", g.srv.URL+"/v1/sandboxes", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(head) + size + len(tail))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+testKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		r := resp{res.StatusCode, res.Header, b}
		if r.status != 400 {
			t.Fatalf("4 MiB of metadata: %d %.300s", r.status, b)
		}
		testkit.WantFields(t, r.problem(t).Errors, map[string]string{"metadata": "must be at most 65536 bytes (the gateway's ceiling)"})
	}
	if r := g.do("GET", "/v1/sandboxes", nil, key()); r.status != 200 || strings.Contains(string(r.body), "sbx-") {
		t.Fatalf("list after refused creates: %d %.300s", r.status, r.body)
	}
	if grew := heap() - before; grew > 2<<20 {
		t.Fatalf("live heap grew by %d KiB after three refused 4 MiB creates", grew>>10)
	} else {
		t.Logf("live heap grew by %d KiB", grew>>10)
	}
}

// repeatByte is an endless stream of one byte.
type repeatByte byte

func (r repeatByte) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r)
	}
	return len(p), nil
}
