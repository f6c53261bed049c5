package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
)

var keyA, keyB = Caller{Bearer: "key-a"}, Caller{Bearer: "key-b"}

// twoKeys configures a gateway with the API keys of keyA and keyB.
func twoKeys(o *Options) { o.APIKeys, o.AllowAnonymous = []string{"key-a", "key-b"}, false }

// wantQuota fails unless err is a QuotaError (429) naming quota.
func wantQuota(t *testing.T, err error, quota string) {
	t.Helper()
	var q *QuotaError
	if !errors.As(err, &q) || q.Quota != quota || providers.Kind(err) != providers.ErrTooMany {
		t.Fatalf("want quota %s exceeded, got %v", quota, err)
	}
	if !strings.Contains(err.Error(), "quota") {
		t.Fatalf("message does not say it is a quota: %v", err)
	}
}

func (e *env) live(t *testing.T) int {
	t.Helper()
	l, err := e.p.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

// A batch of --max-sandboxes from key A waits for slots; key B's single
// create, queued after it, gets the first slot that frees (A holds every
// other one), long before the queue timeout; A's batch completes after.
func TestFairQueueAcrossKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { twoKeys(o); o.MaxSandboxes = 4; o.QueueTimeout = 10 * time.Minute })
		ctx := context.Background()
		first, err := e.svc.Create(ctx, keyA, CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		batch := make(chan error, 1)
		go func() {
			_, _, err := e.svc.CreateBatch(ctx, keyA, CreateRequest{}, 4, false)
			batch <- err
		}()
		synctest.Wait()
		if got := e.svc.slots.waiting(); got != 1 {
			t.Fatalf("A's batch: %d waiting, want 1 (three took the free slots)", got)
		}

		start := time.Now()
		type result struct {
			ref Ref
			err error
		}
		bDone := make(chan result, 1)
		go func() {
			ref, err := e.svc.Create(ctx, keyB, CreateRequest{})
			bDone <- result{ref, err}
		}()
		synctest.Wait()
		if got := e.svc.slots.waiting(); got != 2 {
			t.Fatalf("B's create: %d waiting, want 2", got)
		}
		if err := e.svc.Delete(ctx, Caller{Bearer: "key-a"}, first.SandboxID); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		var b result
		select {
		case b = <-bDone:
		default:
			t.Fatal("the freed slot went to A's older waiter, not to B (which holds none)")
		}
		if b.err != nil {
			t.Fatalf("B's create: %v", b.err)
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("B waited %s", waited)
		}
		select {
		case err := <-batch:
			t.Fatalf("A's batch finished without a free slot: %v", err)
		default:
		}
		if err := e.svc.Delete(ctx, keyB, b.ref.SandboxID); err != nil {
			t.Fatal(err)
		}
		if err := <-batch; err != nil {
			t.Fatalf("A's batch: %v", err)
		}
		if time.Since(start) != 0 || e.live(t) != 4 {
			t.Fatalf("after A's batch: %d live, %s later", e.live(t), time.Since(start))
		}
	})
}

// With two keys waiting, freed slots alternate between them (the key with
// fewer live sandboxes first), and each key's own creates stay FIFO.
func TestFairShareAlternates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSlots(2)
		ctx := context.Background()
		a, b := demand{key: "a"}, demand{key: "b"}
		for range 2 {
			if err := s.acquire(ctx, a, time.Second); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		for i, d := range []demand{a, a, a, b, b} {
			wg.Go(func() {
				if err := s.acquire(ctx, d, time.Hour); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				order = append(order, d.key+string(rune('0'+i)))
				mu.Unlock()
			})
			synctest.Wait() // queued in this order
		}
		for k := range 5 {
			// The oldest holder leaves: a's first two, then in grant order.
			d := a
			if k >= 2 {
				mu.Lock()
				d = demand{key: order[k-2][:1]}
				mu.Unlock()
			}
			s.release(d)
			synctest.Wait()
		}
		wg.Wait()
		if got := strings.Join(order, " "); got != "b3 a0 b4 a1 a2" {
			t.Fatalf("grant order %q, want b3 a0 b4 a1 a2", got)
		}
	})
}

// A create that would take its key over a quota is refused at once with a
// QuotaError naming it, and nothing is made; another key is not affected.
func TestPerKeyQuotas(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	e := newEnv(t, func(o *Options) {
		twoKeys(o)
		o.Metrics = m
		o.DefaultMemoryMiB, o.DefaultDiskGiB = 512, 1
		o.Quotas = Quotas{Sandboxes: 2, MemoryMiB: 1536, DiskMiB: 3 << 10}
	})
	ctx := context.Background()
	mib := func(n int64) *int64 { return &n }
	gib := func(n float64) *float64 { return &n }
	for range 2 {
		if _, err := e.svc.Create(ctx, keyA, CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.svc.Create(ctx, keyA, CreateRequest{})
	wantQuota(t, err, "sandboxes")
	_, _, err = e.svc.CreateBatch(ctx, keyA, CreateRequest{}, 2, false)
	wantQuota(t, err, "sandboxes")

	if _, err := e.svc.Create(ctx, keyB, CreateRequest{Resources: providers.Resources{MemoryMiB: mib(1024)}}); err != nil {
		t.Fatalf("key B is not limited by key A's use: %v", err)
	}
	_, err = e.svc.Create(ctx, keyB, CreateRequest{Resources: providers.Resources{MemoryMiB: mib(1024)}})
	wantQuota(t, err, "memory_mib")
	_, err = e.svc.Create(ctx, keyB, CreateRequest{Resources: providers.Resources{MemoryMiB: mib(256), DiskGiB: gib(2.5)}})
	wantQuota(t, err, "disk_gib")
	if n := e.live(t); n != 3 {
		t.Fatalf("%d sandboxes after refused creates, want 3", n)
	}
	if got := testutil.ToFloat64(m.QuotaRefusals.WithLabelValues("sandboxes")); got != 2 {
		t.Fatalf("sandboxes refusals counted %v, want 2", got)
	}
	if got := gauge(t, reg, "sandgate_committed_memory_bytes"); got != 2048<<20 {
		t.Fatalf("sandgate_committed_memory_bytes %v, want %d", got, 2048<<20)
	}
	// A fork over the key's quota is refused before anything is made.
	a, err := e.svc.List(ctx, keyA, ListFilter{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Fork(ctx, keyA, a[0].ID, 1)
	wantQuota(t, err, "sandboxes")
	if n := len(e.p.Snapshots()); n != 0 {
		t.Fatalf("a refused fork left %d snapshots", n)
	}
	q, err := e.svc.Quota(ctx, keyB)
	if err != nil || q.Sandboxes != 1 || q.MemoryMiB != 1024 || q.DiskMiB != 1024 || q.Limits.Sandboxes != 2 {
		t.Fatalf("key B's quota: %+v %v", q, err)
	}
	if q.Gateway.Sandboxes != 3 || q.Gateway.MemoryMiB != 2048 {
		t.Fatalf("gateway admission: %+v", q.Gateway)
	}
}

// A create that does not fit the memory budget waits like one over
// capacity, then ErrUnavailable naming the budget; one that could never
// fit is refused at once naming the field; a freed budget admits again.
func TestAdmissionBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) {
			o.DefaultMemoryMiB, o.DefaultDiskGiB = 512, 1
			o.Budget = Budget{MemoryMiB: 1024, DiskMiB: 10 << 10}
			o.QueueTimeout = time.Minute
		})
		ctx := context.Background()
		first := e.create(t, CreateRequest{})
		e.create(t, CreateRequest{})

		start := time.Now()
		_, err := e.svc.Create(ctx, Caller{}, CreateRequest{})
		wantKind(t, err, providers.ErrUnavailable)
		if !strings.Contains(err.Error(), "memory budget") || time.Since(start) != time.Minute {
			t.Fatalf("after %s: %v", time.Since(start), err)
		}

		mem, disk := int64(2048), 11.0
		start = time.Now()
		_, err = e.svc.Create(ctx, Caller{}, CreateRequest{Resources: providers.Resources{MemoryMiB: &mem, DiskGiB: &disk}})
		var f providers.InvalidFields
		if !errors.As(err, &f) || len(f) != 2 || f[0].Field != "resources.memory_mib" || f[1].Field != "resources.disk_gib" || time.Since(start) != 0 {
			t.Fatalf("could never fit: %v after %s", err, time.Since(start))
		}
		if n := e.live(t); n != 2 {
			t.Fatalf("%d sandboxes, want 2", n)
		}

		// A waiter gets the budget a delete frees.
		done := make(chan error, 1)
		go func() {
			_, err := e.svc.Create(ctx, Caller{}, CreateRequest{})
			done <- err
		}()
		synctest.Wait()
		if err := e.svc.Delete(ctx, lease(first.Token), first.SandboxID); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("queued create after a delete: %v", err)
		}
		if mem, _ := e.svc.slots.committed(); mem != 1024 {
			t.Fatalf("committed %d MiB, want 1024", mem)
		}
	})
}

// Snapshot, then delete the source, three times: the quota shows three
// orphaned snapshots with their bytes; a fourth is over the count quota
// and is not made; deleting the snapshots frees it all.
func TestSnapshotQuotaAndOrphans(t *testing.T) {
	e := newEnv(t, func(o *Options) { twoKeys(o); o.Quotas = Quotas{Snapshots: 3} })
	ctx := context.Background()
	var sids []string
	for i := range 3 {
		ref, err := e.svc.Create(ctx, keyA, CreateRequest{Files: map[string]string{"f": strings.Repeat("x", 1000)}})
		if err != nil {
			t.Fatal(err)
		}
		sn, err := e.svc.Snapshot(ctx, lease(ref.Token), ref.SandboxID, "")
		if err != nil {
			t.Fatal(err)
		}
		sids = append(sids, sn.ID)
		if q, _ := e.svc.Quota(ctx, keyA); q.Snapshots != i+1 || q.OrphanedSnapshots != i {
			t.Fatalf("source still live: %+v", q)
		}
		if err := e.svc.Delete(ctx, lease(ref.Token), ref.SandboxID); err != nil {
			t.Fatal(err)
		}
	}
	q, err := e.svc.Quota(ctx, keyA)
	if err != nil || q.Snapshots != 3 || q.SnapshotBytes != 3000 || q.OrphanedSnapshots != 3 || q.OrphanedSnapshotBytes != 3000 {
		t.Fatalf("after three snapshot-then-delete: %+v %v", q, err)
	}
	if q, _ := e.svc.Quota(ctx, keyB); q.Snapshots != 0 {
		t.Fatalf("key B sees key A's snapshots: %+v", q)
	}

	ref, err := e.svc.Create(ctx, keyA, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Snapshot(ctx, lease(ref.Token), ref.SandboxID, "")
	wantQuota(t, err, "snapshots")
	if n := len(e.p.Snapshots()); n != 3 {
		t.Fatalf("provider holds %d snapshots, want 3", n)
	}

	for _, sid := range sids {
		if d, err := e.svc.DeleteSnapshot(ctx, keyA, sid); err != nil || !d.Deleted {
			t.Fatal(d, err)
		}
	}
	if q, _ := e.svc.Quota(ctx, keyA); q.Snapshots != 0 || q.SnapshotBytes != 0 || q.OrphanedSnapshotBytes != 0 {
		t.Fatalf("after deleting the snapshots: %+v", q)
	}

	// By bytes: a snapshot that takes the key over is refused and gone.
	e.svc.opts.Quotas = Quotas{SnapshotBytes: 1500}
	if _, _, err := e.svc.WriteFile(ctx, lease(ref.Token), ref.SandboxID, "f", strings.NewReader(strings.Repeat("y", 1000))); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Snapshot(ctx, lease(ref.Token), ref.SandboxID, ""); err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Snapshot(ctx, lease(ref.Token), ref.SandboxID, "")
	wantQuota(t, err, "snapshot_bytes")
	if n := len(e.p.Snapshots()); n != 1 {
		t.Fatalf("provider holds %d snapshots, want 1", n)
	}
}

// gauge reads the value of an unlabelled gauge from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
