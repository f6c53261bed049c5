package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBoltRoundTrip: what is written is loaded again after the file is
// reopened; deletes remove exactly what they name.
func TestBoltRoundTrip(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	st, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_800_000_000, 0).UTC()
	rec := Record{ID: "sbx-a", Provider: "fake", State: providers.StateRunning, CreatedAt: at, TTL: time.Minute, Metadata: map[string]string{"k": "v"}}
	owner := Lease{ID: "ls-1", SandboxID: "sbx-a", Scope: ScopeOwner, CreatedAt: at}
	child := Lease{ID: "ls-2", SandboxID: "sbx-a", Scope: ScopeOperate, CreatedAt: at, Parent: "ls-1"}
	sn := Snapshot{ID: "snp-1", SandboxID: "sbx-a", Name: "n", CreatedAt: at}
	for _, err := range []error{
		st.PutRecord(ctx, rec, &owner),
		st.PutLease(ctx, child),
		st.PutRecord(ctx, Record{ID: "sbx-b", State: providers.StateStopped}, nil),
		st.PutSnapshot(ctx, sn),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err == nil {
		t.Fatal("Ping of a closed store succeeded")
	}
	st, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, leases, err := st.Load(ctx)
	if err != nil || len(recs) != 2 || len(leases) != 2 {
		t.Fatalf("load: %v, %+v, %+v", err, recs, leases)
	}
	if recs[0].ID != "sbx-a" || recs[0].Metadata["k"] != "v" || recs[0].TTL != time.Minute || leases[1].Parent != "ls-1" {
		t.Fatalf("loaded %+v, %+v", recs[0], leases)
	}
	if sns, err := st.LoadSnapshots(ctx); err != nil || len(sns) != 1 || sns[0] != sn {
		t.Fatalf("snapshots: %v, %+v", err, sns)
	}
	if err := st.DeleteLeases(ctx, "sbx-a", []string{"ls-2", "ls-none"}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteLeases(ctx, "sbx-none", []string{"ls-1"}); err != nil {
		t.Fatal(err)
	}
	if _, leases, _ := st.Load(ctx); len(leases) != 1 || leases[0].ID != "ls-1" {
		t.Fatalf("leases after a delete: %+v", leases)
	}
	if err := st.DeleteSandbox(ctx, "sbx-a"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSnapshot(ctx, "snp-1"); err != nil {
		t.Fatal(err)
	}
	recs, leases, _ = st.Load(ctx)
	if len(recs) != 1 || recs[0].ID != "sbx-b" || len(leases) != 0 {
		t.Fatalf("after deleting sbx-a: %+v, %+v", recs, leases)
	}
	if sns, _ := st.LoadSnapshots(ctx); len(sns) != 0 {
		t.Fatalf("snapshots left: %+v", sns)
	}
}

// TestBoltCancelled: a call whose context is done changes nothing.
func TestBoltCancelled(t *testing.T) {
	st, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := st.PutRecord(ctx, Record{ID: "sbx-a"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("PutRecord on a cancelled context: %v", err)
	}
	if _, _, err := st.Load(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Load on a cancelled context: %v", err)
	}
	if recs, _, err := st.Load(context.Background()); err != nil || len(recs) != 0 {
		t.Fatalf("stored %+v, %v", recs, err)
	}
}

func TestScope(t *testing.T) {
	for _, c := range []struct {
		have, need Scope
		want       bool
	}{{ScopeOwner, ScopeOwner, true}, {ScopeOwner, ScopeOperate, true}, {ScopeOperate, ScopeOperate, true}, {ScopeOperate, ScopeOwner, false}} {
		if got := c.have.Covers(c.need); got != c.want {
			t.Errorf("%s covers %s: %v", c.have, c.need, got)
		}
	}
	if Scope("admin").Valid() || !ScopeOwner.Valid() || !ScopeOperate.Valid() {
		t.Error("Valid")
	}
}
