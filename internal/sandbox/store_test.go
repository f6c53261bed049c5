package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/store"
	"github.com/sandgate/sandgate/internal/testkit"
)

// gatedStore is the default store with its next record write held at a
// gate once armed: a store slow to take one write while others follow.
type gatedStore struct {
	*store.Bolt
	mu      sync.Mutex
	armed   bool
	entered chan struct{} // closed when the held write arrives
	release chan struct{} // close to let it through
}

func (g *gatedStore) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.entered, g.release = true, make(chan struct{}), make(chan struct{})
}

func (g *gatedStore) PutRecord(ctx context.Context, r Record, l *Lease) error {
	g.mu.Lock()
	hold := g.armed
	g.armed = false
	entered, release := g.entered, g.release
	g.mu.Unlock()
	if hold {
		close(entered)
		<-release
	}
	return g.Bolt.PutRecord(ctx, r, l)
}

// stored is sandbox id's record in st, and whether there is one.
func stored(t *testing.T, st store.Store, id string) (Record, bool) {
	t.Helper()
	recs, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == id {
			return r, true
		}
	}
	return Record{}, false
}

func newGatedEnv(t *testing.T) (*env, *gatedStore) {
	t.Helper()
	dir := t.TempDir()
	b, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedStore{Bolt: b}
	return newEnv(t, func(o *Options) { o.Store, o.StateDir = g, dir }), g
}

// TestRecordWritesInOrder: two renewals of one sandbox whose first write
// is slow to reach the store; the store ends with the second, as memory
// does, not with whichever write landed last.
func TestRecordWritesInOrder(t *testing.T) {
	e, g := newGatedEnv(t)
	ref := e.create(t, CreateRequest{})
	ctx := context.Background()
	first, second := 100*time.Second, 200*time.Second
	g.arm()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := e.svc.Renew(ctx, lease(ref.Token), ref.SandboxID, &first)
		errs <- err
	}()
	<-g.entered
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := e.svc.Renew(ctx, lease(ref.Token), ref.SandboxID, &second)
		errs <- err
	}()
	// The second renewal has changed memory: only its write is left.
	testkit.Eventually(t, "the second renewal in memory", time.Minute, func() bool {
		info, err := e.svc.Get(ctx, lease(ref.Token), ref.SandboxID)
		return err == nil && info.TTL == second
	})
	close(g.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rec, ok := stored(t, g, ref.SandboxID)
	if !ok || rec.TTL != second || !rec.ExpiresAt.Equal(e.clock.Now().Add(second)) {
		t.Fatalf("stored %+v (%v), want the second renewal's ttl %v", rec, ok, second)
	}
	// And so does the next gateway (on the same file: Close closed g).
	e.opts.Store = nil
	e.restart(t)
	if info, err := e.svc.Get(ctx, lease(ref.Token), ref.SandboxID); err != nil || info.TTL != second {
		t.Fatalf("after a restart: %+v, %v", info, err)
	}
}

// TestRemovedRecordStaysRemoved: a delete while a state write of the same
// sandbox is on its way to the store; the record does not come back.
func TestRemovedRecordStaysRemoved(t *testing.T) {
	e, g := newGatedEnv(t)
	ref := e.create(t, CreateRequest{})
	ctx := context.Background()
	g.arm()
	paused := make(chan error, 1)
	go func() {
		_, err := e.svc.Pause(ctx, lease(ref.Token), ref.SandboxID)
		paused <- err
	}()
	<-g.entered
	deleted := make(chan error, 1)
	go func() { deleted <- e.svc.Delete(ctx, lease(ref.Token), ref.SandboxID) }()
	testkit.Eventually(t, "the provider's delete", time.Minute, func() bool { return !e.p.Has(ref.SandboxID) })
	close(g.release)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	if rec, ok := stored(t, g, ref.SandboxID); ok {
		t.Fatalf("the deleted sandbox's record is back: %+v", rec)
	}
}
