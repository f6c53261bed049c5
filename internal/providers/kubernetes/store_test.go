package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
)

// TestStoreRecords: the cluster store keeps a record with its leases and
// activity in one ConfigMap, as another replica (a second provider with
// the same instance id) reads it; activity never goes back; deletes
// remove what they name.
func TestStoreRecords(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	other := newProvider(t, func(o *Options) { o.InstanceID = p.opts.InstanceID })
	a, b := p.Store(), other.Store()
	ctx := ctxT(t, 2*time.Minute)
	at := time.Unix(1_800_000_000, 0).UTC()
	id := "sbx-storetest-" + strings.ToLower(p.opts.InstanceID[len("k8stest-"):])
	owner := store.Lease{ID: "ls-1", SandboxID: id, Scope: store.ScopeOwner, CreatedAt: at}
	child := store.Lease{ID: "ls-2", SandboxID: id, Scope: store.ScopeOperate, CreatedAt: at, Parent: "ls-1"}
	if err := a.PutRecord(ctx, store.Record{ID: id, State: providers.StateRunning, CreatedAt: at, TTL: time.Minute}, &owner); err != nil {
		t.Fatal(err)
	}
	if err := b.PutLease(ctx, child); err != nil {
		t.Fatal(err)
	}
	for _, when := range []time.Time{at.Add(time.Minute), at.Add(time.Second)} { // the later lands first
		if err := a.Touch(ctx, id, when); err != nil {
			t.Fatal(err)
		}
	}
	rec, leases, err := b.Sandbox(ctx, id)
	if err != nil || rec.TTL != time.Minute || len(leases) != 2 || leases[1].Parent != "ls-1" {
		t.Fatalf("read on the other replica: %v, %+v, %+v", err, rec, leases)
	}
	if !rec.ActiveAt.Equal(at.Add(time.Minute)) {
		t.Fatalf("activity %v, want the latest, %v", rec.ActiveAt, at.Add(time.Minute))
	}
	if err := a.DeleteLeases(ctx, id, []string{"ls-2", "ls-none"}); err != nil {
		t.Fatal(err)
	}
	if recs, leases, err := b.Load(ctx); err != nil || len(recs) != 1 || len(leases) != 1 || leases[0].ID != "ls-1" {
		t.Fatalf("load after a lease delete: %v, %+v, %+v", err, recs, leases)
	}
	if err := b.DeleteSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Sandbox(ctx, id); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("read of a deleted record: %v", err)
	}
	if err := a.PutLease(ctx, owner); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("a lease of a deleted record: %v", err)
	}
}

// TestStoreCancelled: a call whose context is done makes no API call that
// changes anything, and says why it stopped.
func TestStoreCancelled(t *testing.T) {
	t.Parallel()
	st := newProvider(t).Store()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := st.PutRecord(ctx, store.Record{ID: "sbx-cancelled"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("PutRecord on a cancelled context: %v", err)
	}
	if recs, _, err := st.Load(ctxT(t, time.Minute)); err != nil || len(recs) != 0 {
		t.Fatalf("stored %+v, %v", recs, err)
	}
}
