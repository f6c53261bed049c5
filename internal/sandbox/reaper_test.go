package sandbox

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
)

// The reaper's own loop, on the bubble's clock: an idle sandbox goes at
// the first tick past its idle timeout, an expired one at the first tick
// past its TTL, a busy-free fresh one stays, and Close stops the loop.
func TestReaperLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.Clock = nil; o.ReapInterval = 10 * time.Second })
		idle := e.create(t, CreateRequest{IdleTimeout: dur(25 * time.Second)})
		expiring := e.create(t, CreateRequest{TTL: dur(45 * time.Second)})
		stays := e.create(t, CreateRequest{TTL: dur(0)})

		// Ticks at 10 s and 20 s: nothing is due.
		time.Sleep(25 * time.Second)
		synctest.Wait()
		for _, id := range []string{idle.SandboxID, expiring.SandboxID, stays.SandboxID} {
			if !e.p.Has(id) {
				t.Fatalf("%s reaped before it was due", id)
			}
		}
		// The tick at 30 s takes the idle one.
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if e.p.Has(idle.SandboxID) || !e.p.Has(expiring.SandboxID) {
			t.Fatalf("at 31 s: idle there %v, expiring there %v; want gone, there", e.p.Has(idle.SandboxID), e.p.Has(expiring.SandboxID))
		}
		// The tick at 50 s, the expired one.
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if e.p.Has(expiring.SandboxID) || !e.p.Has(stays.SandboxID) {
			t.Fatalf("at 51 s: expiring there %v, ttl-0 there %v; want gone, there", e.p.Has(expiring.SandboxID), e.p.Has(stays.SandboxID))
		}
		e.svc.Close() // joins the loop: the bubble ends with no goroutine left
	})
}

// A sandbox that pauses on expiry is paused at its TTL, not removed; it
// then has no expiry until a resume starts a new TTL. A provider that
// cannot pause refuses such a create.
func TestPauseOnExpiry(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{TTL: dur(10 * time.Second), PauseOnExpiry: true})
	e.clock.Advance(11 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 0 {
		t.Fatalf("reaped %d, want 0 (paused instead)", n)
	}
	info, err := e.svc.Get(ctx, lease(a.Token), a.SandboxID)
	if err != nil || info.State != providers.StatePaused || !info.ExpiresAt.IsZero() {
		t.Fatalf("after expiry: %v %s expires %v; want paused, no expiry", err, info.State, info.ExpiresAt)
	}
	if _, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "true"}); providers.Kind(err) != providers.ErrConflict {
		t.Fatalf("exec in the paused sandbox: %v, want a conflict", err)
	}
	e.clock.Advance(1000 * time.Hour)
	if n := e.svc.reap(e.clock.Now()); n != 0 || !e.p.Has(a.SandboxID) {
		t.Fatalf("a sandbox paused at expiry was reaped later (%d)", n)
	}
	info, err = e.svc.Resume(ctx, lease(a.Token), a.SandboxID)
	if err != nil || info.State != providers.StateRunning || !info.ExpiresAt.Equal(e.clock.Now().Add(10*time.Second)) {
		t.Fatalf("resume: %v %s expires %v; want running, a new TTL", err, info.State, info.ExpiresAt)
	}
	// The flag survives a restart; a sandbox paused by hand before its
	// expiry stays paused at it.
	e.restart(t)
	if _, err := e.svc.Pause(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(11 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 0 {
		t.Fatalf("reaped %d after the restart", n)
	}
	info, err = e.svc.Get(ctx, lease(a.Token), a.SandboxID)
	if err != nil || info.State != providers.StatePaused || !info.ExpiresAt.IsZero() {
		t.Fatalf("after the second expiry: %v %s expires %v", err, info.State, info.ExpiresAt)
	}

	// Without the flag, expiry still removes.
	b := e.create(t, CreateRequest{TTL: dur(10 * time.Second)})
	e.clock.Advance(11 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 1 || e.p.Has(b.SandboxID) {
		t.Fatalf("reaped %d, want the sandbox without the flag", n)
	}

	// A pause that fails at expiry removes the sandbox: the TTL holds.
	failing := newEnv(t, func(o *Options) { o.Provider = pauseFails{fake.New()} })
	c := failing.create(t, CreateRequest{TTL: dur(10 * time.Second), PauseOnExpiry: true})
	failing.clock.Advance(11 * time.Second)
	if n := failing.svc.reap(failing.clock.Now()); n != 1 {
		t.Fatalf("reaped %d, want the sandbox whose pause failed", n)
	}
	if _, err := failing.svc.Get(ctx, lease(c.Token), c.SandboxID); err == nil {
		t.Fatal("the sandbox whose pause failed is still there")
	}

	noPause := newEnv(t, func(o *Options) { o.Provider = struct{ providers.Provider }{fake.New()} })
	_, err = noPause.svc.Create(ctx, Caller{}, CreateRequest{PauseOnExpiry: true})
	wantKind(t, err, providers.ErrUnsupported)
	if list, _ := noPause.svc.List(ctx, Caller{}, ListFilter{}); len(list) != 0 {
		t.Fatalf("a refused create left %d sandboxes", len(list))
	}
}

// pauseFails is the fake provider whose Pause always fails.
type pauseFails struct{ *fake.Provider }

func (pauseFails) Pause(context.Context, string) error {
	return providers.Errorf(providers.ErrUnavailable, "pause refused")
}
