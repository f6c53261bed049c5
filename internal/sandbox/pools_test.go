package sandbox

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestParsePool(t *testing.T) {
	p, err := ParsePool("image=py:3,workdir=/w,cpu=0.5,memory_mib=512,disk_gib=1=4")
	if err != nil {
		t.Fatal(err)
	}
	if p.Image != "py:3" || p.Workdir != "/w" || *p.Resources.CPU != 0.5 || *p.Resources.MemoryMiB != 512 || *p.Resources.DiskGiB != 1 || p.Count != 4 {
		t.Fatalf("%+v", p)
	}
	if p.Key() != "image=py:3,workdir=/w,cpu=0.5,memory_mib=512,disk_gib=1" {
		t.Fatalf("key %q", p.Key())
	}
	if p, err := ParsePool("=2"); err != nil || p.Count != 2 || p.Key() != "image=,workdir=/workspace" {
		t.Fatalf("=2: %+v %v", p, err)
	}
	for _, bad := range []string{"", "image=x", "image=x=0", "image=x=1001", "cpu=-1=2", "memory_mib=1.5=2", "color=red=2", "workdir=rel=2", "workdir=/a/../b=2", "image=x,junk=1", "cpu=NaN=1", "disk_gib=Inf=1", "cpu=+Inf=1"} {
		if _, err := ParsePool(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// A pool fills to its count; a matching create claims a ready sandbox
// (with its env applied to every command, its files, metadata and TTL),
// and the pool refills; pool sandboxes are never listed; a create that
// does not match is a normal one; an empty pool is a miss; Close deletes
// the ready ones.
func TestPoolClaimMissRefill(t *testing.T) {
	var envMu sync.Mutex
	var lastEnv map[string]string
	e := newEnv(t, func(o *Options) {
		o.Pools = []PoolSpec{{Workdir: "/work", Count: 2}}
	})
	e.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		envMu.Lock()
		lastEnv = req.Env
		envMu.Unlock()
		return providers.ExecResult{}, nil
	}
	key := PoolSpec{Workdir: "/work"}.Key()
	ready := func() int { return e.svc.PoolReady()[key] }
	testkit.Eventually(t, "the pool to fill", 10*time.Second, func() bool { return ready() == 2 })
	ctx := context.Background()
	if l, _ := e.svc.List(ctx, Caller{}, ListFilter{}); len(l) != 0 {
		t.Fatalf("pool sandboxes listed: %v", l)
	}
	e.svc.mu.Lock()
	pooled := []string{e.svc.pools[key].ready[0].ID, e.svc.pools[key].ready[1].ID}
	e.svc.mu.Unlock()

	ref, err := e.svc.Create(ctx, Caller{}, CreateRequest{Workdir: "/work", Env: map[string]string{"A": "1"}, Files: map[string]string{"f.txt": "hi"}, Metadata: map[string]string{"team": "rl"}, TTL: dur(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pooled, ref.SandboxID) || ref.Extra["warm_pool"] != true {
		t.Fatalf("create did not claim from the pool: %+v (pool had %v)", ref, pooled)
	}
	if got := e.read(t, lease(ref.Token), ref.SandboxID, "f.txt"); got != "hi" {
		t.Fatalf("files: %q", got)
	}
	if _, err := e.svc.Exec(ctx, lease(ref.Token), ref.SandboxID, ExecRequest{Command: "env", Env: map[string]string{"B": "2"}}); err != nil {
		t.Fatal(err)
	}
	envMu.Lock()
	if lastEnv["A"] != "1" || lastEnv["B"] != "2" {
		t.Fatalf("exec env %v, want the create's A and the exec's B", lastEnv)
	}
	envMu.Unlock()
	info, err := e.svc.Get(ctx, lease(ref.Token), ref.SandboxID)
	if err != nil || info.Metadata["team"] != "rl" || info.ExpiresAt.Sub(info.CreatedAt) < 59*time.Minute {
		t.Fatalf("info %+v %v", info, err)
	}
	if n := testutil.ToFloat64(e.svc.m.PoolClaims.WithLabelValues(key)); n != 1 {
		t.Fatalf("claims %v", n)
	}
	testkit.Eventually(t, "the refill", 10*time.Second, func() bool { return ready() == 2 })

	// Not matching: a normal create, no claim, no miss.
	other, err := e.svc.Create(ctx, Caller{}, CreateRequest{Workdir: "/elsewhere"})
	if err != nil || other.Extra["warm_pool"] == true {
		t.Fatalf("non-matching create: %+v %v", other, err)
	}
	// Drain the pool faster than it refills: the provider fails creates.
	e.p.CreateErr = providers.Errorf(providers.ErrUnavailable, "backend down")
	for range 2 {
		if _, err := e.svc.Create(ctx, Caller{}, CreateRequest{Workdir: "/work"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.svc.Create(ctx, Caller{}, CreateRequest{Workdir: "/work"})
	wantKind(t, err, providers.ErrUnavailable) // the miss's normal create failed
	if n := testutil.ToFloat64(e.svc.m.PoolMisses.WithLabelValues(key)); n != 1 {
		t.Fatalf("misses %v", n)
	}
	e.p.CreateErr = nil
	testkit.Eventually(t, "the refill after the backend came back", 10*time.Second, func() bool { return ready() == 2 })
	e.svc.mu.Lock()
	left := []string{e.svc.pools[key].ready[0].ID, e.svc.pools[key].ready[1].ID}
	e.svc.mu.Unlock()
	e.svc.Close()
	for _, id := range left {
		if _, err := e.p.Status(ctx, id); providers.Kind(err) != providers.ErrNotFound {
			t.Fatalf("pool sandbox %s after Close: %v", id, err)
		}
	}
}
