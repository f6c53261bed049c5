package sandbox

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
	"github.com/sandgate/sandgate/internal/testkit"
)

// memShared is a SharedStore in memory: what two replicas share (the
// kubernetes provider's lives in the cluster). The fake is the point.
type memShared struct {
	mu      sync.Mutex
	recs    map[string]Record
	leases  map[string]map[string]Lease
	active  map[string]time.Time
	touches int
	puts    []Record // every PutRecord, in order
	// afterLoad, when set, runs after the next Load (unlocked).
	afterLoad func()
}

func newMemShared() *memShared {
	return &memShared{recs: map[string]Record{}, leases: map[string]map[string]Lease{}, active: map[string]time.Time{}}
}

func (m *memShared) Load(context.Context) ([]Record, []Lease, error) {
	m.mu.Lock()
	after := m.afterLoad
	m.afterLoad = nil
	if after != nil {
		defer after()
	}
	defer m.mu.Unlock()
	var rs []Record
	var ls []Lease
	for id, r := range m.recs {
		r.ActiveAt = m.active[id]
		rs = append(rs, r)
		for _, l := range m.leases[id] {
			ls = append(ls, l)
		}
	}
	return rs, ls, nil
}

func (m *memShared) PutRecord(_ context.Context, r Record, l *Lease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[r.ID] = r
	m.puts = append(m.puts, r)
	if l != nil {
		if m.leases[r.ID] == nil {
			m.leases[r.ID] = map[string]Lease{}
		}
		m.leases[r.ID][l.ID] = *l
	}
	return nil
}

func (m *memShared) PutLease(_ context.Context, l Lease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[l.SandboxID]; !ok {
		return providers.Errorf(providers.ErrNotFound, "no record")
	}
	if m.leases[l.SandboxID] == nil {
		m.leases[l.SandboxID] = map[string]Lease{}
	}
	m.leases[l.SandboxID][l.ID] = l
	return nil
}

func (m *memShared) DeleteLeases(_ context.Context, sid string, lids []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, lid := range lids {
		delete(m.leases[sid], lid)
	}
	return nil
}

func (m *memShared) DeleteSandbox(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, id)
	delete(m.leases, id)
	delete(m.active, id)
	return nil
}

func (m *memShared) Sandbox(_ context.Context, id string) (Record, []Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return Record{}, nil, providers.Errorf(providers.ErrNotFound, "no record")
	}
	r.ActiveAt = m.active[id]
	return r, slicesOf(m.leases[id]), nil
}

func slicesOf(m map[string]Lease) []Lease { return slices.Collect(maps.Values(m)) }

func (m *memShared) Touch(_ context.Context, id string, at time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.touches++
	m.active[id] = at
	return nil
}

func (m *memShared) Ping(context.Context) error { return nil }
func (m *memShared) Close() error               { return nil }

// replicas are two services over one provider and one shared store, with
// the same lease secret.
func replicas(t *testing.T) (a, b *Service, p *fake.Provider, st *memShared, clock *testkit.Clock) {
	t.Helper()
	p, st, clock = fake.New(), newMemShared(), testkit.NewClock(time.Unix(1_800_000_000, 0))
	open := func() *Service {
		svc, err := New(context.Background(), Options{Provider: p, StateDir: t.TempDir(), Store: st, LeaseSecret: "shared-secret-for-both-replicas", AllowAnonymous: true, Clock: clock, ReapInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { svc.Close() })
		return svc
	}
	return open(), open(), p, st, clock
}

func TestSharedStoreReplicas(t *testing.T) {
	a, b, _, st, _ := replicas(t)
	ctx := context.Background()
	ref, err := a.Create(ctx, Caller{}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Made on A, served by B.
	if _, err := b.Exec(ctx, lease(ref.Token), ref.SandboxID, ExecRequest{Command: "true"}); err != nil {
		t.Fatalf("exec on B: %v", err)
	}
	if list, err := b.List(ctx, Caller{}, ListFilter{}); err != nil || len(list) != 1 {
		t.Fatalf("list on B: %v %v", list, err)
	}
	// Minted on B, released on A: refused by B at once.
	op, err := b.Mint(ctx, lease(ref.Token), ref.SandboxID, ScopeOperate, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Exec(ctx, lease(op.Token), ref.SandboxID, ExecRequest{Command: "true"}); err != nil {
		t.Fatalf("the operate lease on A: %v", err)
	}
	if _, err := a.Release(ctx, lease(op.Token), ref.SandboxID); err != nil {
		t.Fatal(err)
	}
	_, err = b.Exec(ctx, lease(op.Token), ref.SandboxID, ExecRequest{Command: "true"})
	wantKind(t, err, providers.ErrUnauthorized)
	// Deleted on B: gone for A.
	if err := b.Delete(ctx, lease(ref.Token), ref.SandboxID); err != nil {
		t.Fatal(err)
	}
	_, err = a.Get(ctx, lease(ref.Token), ref.SandboxID)
	wantKind(t, err, providers.ErrNotFound)
	if list, _ := a.List(ctx, Caller{}, ListFilter{}); len(list) != 0 {
		t.Fatalf("A still lists %v", list)
	}
	if len(st.recs) != 0 {
		t.Fatalf("records left: %v", st.recs)
	}
}

// A create writes its record (starting) before the sandbox exists, so a
// replica reconciling meanwhile does not take the sandbox for an orphan;
// a failed create leaves no record.
func TestSharedStoreCreateOrder(t *testing.T) {
	a, _, p, st, _ := replicas(t)
	ctx := context.Background()
	if _, err := a.Create(ctx, Caller{}, CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if len(st.puts) != 2 || st.puts[0].State != providers.StateStarting || st.puts[1].State != providers.StateRunning {
		t.Fatalf("records written: %+v, want starting then running", st.puts)
	}
	p.CreateErr = providers.Errorf(providers.ErrInvalid, "no")
	if _, err := a.Create(ctx, Caller{}, CreateRequest{}); err == nil {
		t.Fatal("create did not fail")
	}
	if len(st.puts) != 3 || st.puts[2].State != providers.StateStarting {
		t.Fatalf("records written: %+v", st.puts)
	}
	if len(st.recs) != 1 {
		t.Fatalf("a failed create left its record: %v", st.recs)
	}
}

// A replica starting while another creates: the create's record and
// sandbox made between the starting replica's read of the records and
// its list of the provider's sandboxes. The sandbox is not an orphan: it
// is left alone, and the new replica serves it.
func TestSharedStoreReconcileRacesCreate(t *testing.T) {
	a, _, p, st, clock := replicas(t)
	ctx := context.Background()
	var ref Ref
	st.mu.Lock()
	st.afterLoad = func() {
		var err error
		if ref, err = a.Create(ctx, Caller{}, CreateRequest{}); err != nil {
			t.Error(err)
		}
	}
	st.mu.Unlock()
	c, err := New(ctx, Options{Provider: p, StateDir: t.TempDir(), Store: st, LeaseSecret: "shared-secret-for-both-replicas", AllowAnonymous: true, Clock: clock, ReapInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ref.SandboxID == "" {
		t.Fatal("no create ran between the load and the list")
	}
	if _, err := c.Exec(ctx, lease(ref.Token), ref.SandboxID, ExecRequest{Command: "true"}); err != nil {
		t.Fatalf("the sandbox made meanwhile, on the new replica: %v", err)
	}
}

// A delete whose sandbox takes its record along (a kubernetes record is
// owned by its pod: the garbage collector removes it once the pod is
// gone), with the replica's sync running before the delete ends: the
// delete succeeds, its caller gets no 404, and nothing is left. (Under
// load, TestKubernetesDeployment's deletes met this: "sandbox … not
// found" for a sandbox the delete had just removed.)
func TestSharedStoreDeleteRacesSync(t *testing.T) {
	a, b, p, st, _ := replicas(t)
	ctx := context.Background()
	ref, err := a.Create(ctx, Caller{}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	synced := false
	p.OnDelete = func(id string) {
		if err := st.DeleteSandbox(ctx, id); err != nil {
			t.Error(err)
		}
		if err := b.syncShared(ctx); err != nil {
			t.Error(err)
		}
		synced = true
	}
	if err := b.Delete(ctx, lease(ref.Token), ref.SandboxID); err != nil || !synced {
		t.Fatalf("delete on B with its sync meanwhile: %v (synced %v)", err, synced)
	}
	_, err = b.Get(ctx, lease(ref.Token), ref.SandboxID)
	wantKind(t, err, providers.ErrNotFound)
	// Two deletes at once still answer one 404: the second finds the
	// sandbox being removed by the first, or gone.
	ref, err = a.Create(ctx, Caller{}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	p.OnDelete = func(string) {
		p.OnDelete = nil
		second <- b.Delete(ctx, lease(ref.Token), ref.SandboxID)
	}
	first := b.Delete(ctx, lease(ref.Token), ref.SandboxID)
	errs := []error{first, <-second}
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two deletes at once: %v, %v; want one success and one not found", errs[0], errs[1])
	}
	for _, err := range errs {
		if err != nil {
			wantKind(t, err, providers.ErrNotFound)
		}
	}
	if list, _ := a.List(ctx, Caller{}, ListFilter{}); len(list) != 0 || len(st.recs) != 0 {
		t.Fatalf("left: listed %v, records %v", list, st.recs)
	}
}

// Activity on one replica keeps the sandbox from being reaped as idle by
// the other, and is written at most every activityEvery.
func TestSharedStoreIdleCountsEveryReplica(t *testing.T) {
	a, b, _, st, clock := replicas(t)
	ctx := context.Background()
	ref, err := a.Create(ctx, Caller{}, CreateRequest{IdleTimeout: dur(30 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // B is idle; A is busy
		clock.Advance(20 * time.Second)
		if _, err := a.Exec(ctx, lease(ref.Token), ref.SandboxID, ExecRequest{Command: "true"}); err != nil {
			t.Fatal(err)
		}
		if err := b.syncShared(ctx); err != nil {
			t.Fatal(err)
		}
		if n := b.reap(clock.Now()); n != 0 {
			t.Fatal("B reaped a sandbox busy on A")
		}
	}
	touches := st.touches
	for range 10 {
		a.Exec(ctx, lease(ref.Token), ref.SandboxID, ExecRequest{Command: "true"})
	}
	if st.touches != touches {
		t.Errorf("%d activity writes within %v", st.touches-touches, activityEvery)
	}
	clock.Advance(31 * time.Second)
	b.syncShared(ctx)
	if n := b.reap(clock.Now()); n != 1 {
		t.Fatal("B did not reap the sandbox idle everywhere")
	}
}
