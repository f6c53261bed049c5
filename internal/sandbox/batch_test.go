package sandbox

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// count on create: all made at once; a failure undoes the batch unless
// allow_partial, which keeps the ones made and names the failed.
func TestCreateBatch(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	refs, failed, err := e.svc.CreateBatch(ctx, Caller{}, CreateRequest{Files: map[string]string{"f": "x"}}, 5, false)
	if err != nil || len(refs) != 5 || len(failed) != 0 {
		t.Fatalf("batch of 5: %d refs, %v, %v", len(refs), failed, err)
	}
	seen := map[string]bool{}
	for _, r := range refs {
		if seen[r.SandboxID] || e.read(t, lease(r.Token), r.SandboxID, "f") != "x" {
			t.Fatalf("batch sandbox %+v", r)
		}
		seen[r.SandboxID] = true
	}
	_, _, err = e.svc.CreateBatch(ctx, Caller{}, CreateRequest{}, 0, false)
	wantKind(t, err, providers.ErrInvalid)
	_, _, err = e.svc.CreateBatch(ctx, Caller{}, CreateRequest{}, MaxFork+1, false)
	wantKind(t, err, providers.ErrInvalid)

	// Every third create fails.
	var n atomic.Int32
	e.p.CreateCheck = func(providers.CreateSpec) error {
		if n.Add(1)%3 == 0 {
			return providers.Errorf(providers.ErrUnavailable, "backend hiccup")
		}
		return nil
	}
	before, _ := e.svc.List(ctx, Caller{}, ListFilter{})
	_, _, err = e.svc.CreateBatch(ctx, Caller{}, CreateRequest{}, 6, false)
	wantKind(t, err, providers.ErrUnavailable)
	if after, _ := e.svc.List(ctx, Caller{}, ListFilter{}); len(after) != len(before) {
		t.Fatalf("an all-or-nothing batch that failed left %d sandboxes", len(after)-len(before))
	}
	n.Store(0)
	refs, failed, err = e.svc.CreateBatch(ctx, Caller{}, CreateRequest{}, 6, true)
	if err != nil || len(refs) != 4 || len(failed) != 2 {
		t.Fatalf("partial batch: %d made, %d failed, %v", len(refs), len(failed), err)
	}
	for _, f := range failed {
		if providers.Kind(f.Err) != providers.ErrUnavailable || f.Index < 0 || f.Index >= 6 {
			t.Fatalf("failure %+v", f)
		}
	}
	if after, _ := e.svc.List(ctx, Caller{}, ListFilter{}); len(after) != len(before)+4 {
		t.Fatalf("a partial batch kept %d, want 4", len(after)-len(before))
	}
	e.p.CreateCheck = func(providers.CreateSpec) error { return providers.Errorf(providers.ErrUnavailable, "down") }
	_, _, err = e.svc.CreateBatch(ctx, Caller{}, CreateRequest{}, 2, true)
	wantKind(t, err, providers.ErrUnavailable) // none made: an error even with allow_partial
}
