package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// TestForgedClaimsRefused: someone who read the signing key can make a
// token say anything, but a token only names a lease; claims that differ
// from the stored lease (scope, expiry, sandbox) are refused with 401.
func TestForgedClaimsRefused(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	b := e.create(t, CreateRequest{})
	op, err := e.svc.Mint(ctx, lease(a.Token), a.SandboxID, ScopeOperate, dur(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	opExp := op.ExpiresAt
	forge := func(c claims) Caller { return lease(e.svc.sign.mint(c)) }
	for _, tc := range []struct {
		name string
		c    claims
	}{
		{"owner scope for an operate lease", claims{SandboxID: a.SandboxID, LeaseID: op.LeaseID, Scope: ScopeOwner, Expires: opExp}},
		{"no expiry for an expiring lease", claims{SandboxID: a.SandboxID, LeaseID: op.LeaseID, Scope: ScopeOperate}},
		{"a later expiry", claims{SandboxID: a.SandboxID, LeaseID: op.LeaseID, Scope: ScopeOperate, Expires: opExp.Add(time.Hour)}},
		{"owner, no expiry", claims{SandboxID: a.SandboxID, LeaseID: op.LeaseID, Scope: ScopeOwner}},
		{"sandbox B's owner lease under A's id", claims{SandboxID: a.SandboxID, LeaseID: b.LeaseID, Scope: ScopeOwner}},
	} {
		err := e.svc.Delete(ctx, forge(tc.c), a.SandboxID)
		wantKind(t, err, providers.ErrUnauthorized)
		if _, err := e.svc.Get(ctx, forge(tc.c), a.SandboxID); providers.Kind(err) != providers.ErrUnauthorized {
			t.Errorf("%s: get: %v, want 401", tc.name, err)
		}
	}
	// B's lease named under A's id is refused on every route, exec included.
	_, err = e.svc.Exec(ctx, forge(claims{SandboxID: a.SandboxID, LeaseID: b.LeaseID, Scope: ScopeOwner}), a.SandboxID, ExecRequest{Command: "true"})
	wantKind(t, err, providers.ErrUnauthorized)
	// The honest claims still work, and the real owner can still delete.
	if _, err := e.svc.Get(ctx, forge(claims{SandboxID: a.SandboxID, LeaseID: op.LeaseID, Scope: ScopeOperate, Expires: opExp}), a.SandboxID); err != nil {
		t.Fatalf("a token with the lease's own claims: %v", err)
	}
	if !e.p.Has(a.SandboxID) {
		t.Fatal("a forged token deleted the sandbox")
	}
	if err := e.svc.Delete(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
}

// TestForgedClaimsKeepErrorOrder: a forged token is still checked in the
// 401 -> 403 -> 404 order, so it cannot probe ids either.
func TestForgedClaimsKeepErrorOrder(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	b := e.create(t, CreateRequest{})
	forged := lease(e.svc.sign.mint(claims{SandboxID: b.SandboxID, LeaseID: a.LeaseID, Scope: ScopeOwner}))
	_, err := e.svc.Get(ctx, forged, a.SandboxID)
	wantKind(t, err, providers.ErrForbidden) // names sandbox B: 403 on A, as any token for B
	_, err = e.svc.Get(ctx, forged, b.SandboxID)
	wantKind(t, err, providers.ErrUnauthorized) // names A's lease: refused on B
	unknown := lease(e.svc.sign.mint(claims{SandboxID: "sbx-aaaaaaaaaaaaaaaaaaaa", LeaseID: a.LeaseID, Scope: ScopeOwner}))
	_, err = e.svc.Get(ctx, unknown, "sbx-aaaaaaaaaaaaaaaaaaaa")
	wantKind(t, err, providers.ErrNotFound) // verified, for that id: the id is unknown
}

// TestMintCappedByParent: a lease can neither outlive nor out-scope the
// lease that mints it.
func TestMintCappedByParent(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	op, err := e.svc.Mint(ctx, lease(a.Token), a.SandboxID, ScopeOperate, dur(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Mint(ctx, lease(op.Token), a.SandboxID, ScopeOperate, dur(11*24*time.Hour))
	var f providers.InvalidFields
	if !errors.As(err, &f) || len(f) != 1 || f[0].Field != "ttl_s" || !strings.Contains(f[0].Message, "20 s left") {
		t.Fatalf("11-day lease from a 20 s lease: %v", err)
	}
	e.clock.Advance(5 * time.Second)
	_, err = e.svc.Mint(ctx, lease(op.Token), a.SandboxID, ScopeOperate, dur(16*time.Second))
	if !errors.As(err, &f) || !strings.Contains(f[0].Message, "15 s left") {
		t.Fatalf("16 s lease from a lease with 15 s left: %v", err)
	}
	_, err = e.svc.Mint(ctx, lease(op.Token), a.SandboxID, ScopeOwner, nil)
	wantKind(t, err, providers.ErrForbidden)

	child, err := e.svc.Mint(ctx, lease(op.Token), a.SandboxID, ScopeOperate, nil)
	if err != nil || !child.ExpiresAt.Equal(op.ExpiresAt) {
		t.Fatalf("ttl null under a 20 s lease: %v, expires %v, want the parent's %v", err, child.ExpiresAt, op.ExpiresAt)
	}
	within, err := e.svc.Mint(ctx, lease(op.Token), a.SandboxID, ScopeOperate, dur(15*time.Second))
	if err != nil || within.ExpiresAt.After(op.ExpiresAt) {
		t.Fatalf("15 s lease with 15 s left: %v, expires %v (parent %v)", err, within.ExpiresAt, op.ExpiresAt)
	}
	grand, err := e.svc.Mint(ctx, lease(child.Token), a.SandboxID, ScopeOperate, nil)
	if err != nil || !grand.ExpiresAt.Equal(op.ExpiresAt) {
		t.Fatalf("grandchild: %v, expires %v", err, grand.ExpiresAt)
	}
	// All of them end with the first one.
	e.clock.Advance(15 * time.Second)
	for _, r := range []Ref{op, child, within, grand} {
		_, err := e.svc.Get(ctx, lease(r.Token), a.SandboxID)
		wantKind(t, err, providers.ErrUnauthorized)
	}
	// An owner lease without expiry mints any ttl.
	if _, err := e.svc.Mint(ctx, lease(a.Token), a.SandboxID, ScopeOperate, dur(11*24*time.Hour)); err != nil {
		t.Fatalf("owner without expiry minting 11 days: %v", err)
	}
}
