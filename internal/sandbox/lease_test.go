package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
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

// chain mints a lease from each previous one: the first from tok.
func chain(t *testing.T, svc *Service, id, tok string, n int) []Ref {
	t.Helper()
	var out []Ref
	for range n {
		r, err := svc.Mint(context.Background(), lease(tok), id, ScopeOperate, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
		tok = r.Token
	}
	return out
}

// wantRevoked checks that every ref's token answers 401 on status, exec,
// mint and release, on svc.
func wantRevoked(t *testing.T, svc *Service, id string, refs ...Ref) {
	t.Helper()
	ctx := context.Background()
	for _, r := range refs {
		_, err := svc.Get(ctx, lease(r.Token), id)
		wantKind(t, err, providers.ErrUnauthorized)
		_, err = svc.Exec(ctx, lease(r.Token), id, ExecRequest{Command: "true"})
		wantKind(t, err, providers.ErrUnauthorized)
		_, err = svc.Mint(ctx, lease(r.Token), id, ScopeOperate, nil)
		wantKind(t, err, providers.ErrUnauthorized)
		_, err = svc.Release(ctx, lease(r.Token), id)
		wantKind(t, err, providers.ErrUnauthorized)
	}
}

// wantLive checks that every ref's token still execs on svc.
func wantLive(t *testing.T, svc *Service, id string, refs ...Ref) {
	t.Helper()
	for _, r := range refs {
		if _, err := svc.Exec(context.Background(), lease(r.Token), id, ExecRequest{Command: "true"}); err != nil {
			t.Fatalf("lease %s: %v", r.LeaseID, err)
		}
	}
}

// leaseIDs is what Leases lists for id, as "id<-parent" in list order.
func leaseIDs(t *testing.T, svc *Service, owner, id string) []string {
	t.Helper()
	ls, err := svc.Leases(context.Background(), lease(owner), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		out = append(out, l.ID+"<-"+l.Parent)
	}
	return out
}

// TestReleaseRevokesSubtree: OP mints CH, CH mints CH2; releasing OP ends
// all three, at once and after a restart, and nothing else.
func TestReleaseRevokesSubtree(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	id := a.SandboxID
	c := chain(t, e.svc, id, a.Token, 3) // OP, CH, CH2
	sibling := chain(t, e.svc, id, a.Token, 1)[0]
	other := e.create(t, CreateRequest{})
	otherOp := chain(t, e.svc, other.SandboxID, other.Token, 1)[0]

	left, err := e.svc.Release(ctx, lease(c[0].Token), id)
	if err != nil || left != 2 {
		t.Fatalf("release OP: %v, %d left, want 2 (the owner and the sibling)", err, left)
	}
	wantRevoked(t, e.svc, id, c...)
	wantLive(t, e.svc, id, a, sibling)
	wantLive(t, e.svc, other.SandboxID, other, otherOp)

	e.restart(t)
	wantRevoked(t, e.svc, id, c...)
	wantLive(t, e.svc, id, a, sibling)
	if got := leaseIDs(t, e.svc, a.Token, id); len(got) != 2 {
		t.Fatalf("leases after the restart: %v", got)
	}
}

// TestRevokeMiddleNode: revoking a lease in the middle of a tree ends its
// subtree only; the list shows scope, parent and expiry of what is left.
func TestRevokeMiddleNode(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	id := a.SandboxID
	e.clock.Advance(time.Second) // listed oldest first
	op, err := e.svc.Mint(ctx, lease(a.Token), id, ScopeOperate, dur(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ch := chain(t, e.svc, id, op.Token, 2) // CH, CH2
	e.clock.Advance(time.Second)           // CH' is listed after CH and CH2
	side := chain(t, e.svc, id, op.Token, 1)[0]

	n, err := e.svc.Revoke(ctx, lease(a.Token), id, ch[0].LeaseID)
	if err != nil || n != 2 {
		t.Fatalf("revoke CH: %v, revoked %d, want 2", err, n)
	}
	wantRevoked(t, e.svc, id, ch...)
	wantLive(t, e.svc, id, a, op, side)

	ls, err := e.svc.Leases(ctx, lease(a.Token), id)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id, parent string
		scope      Scope
		expires    time.Time
	}
	want := []row{
		{a.LeaseID, "", ScopeOwner, time.Time{}},
		{op.LeaseID, a.LeaseID, ScopeOperate, op.ExpiresAt},
		{side.LeaseID, op.LeaseID, ScopeOperate, op.ExpiresAt}, // no ttl_s: the parent's expiry
	}
	if len(ls) != len(want) {
		t.Fatalf("listed %d leases, want %d: %+v", len(ls), len(want), ls)
	}
	for i, w := range want {
		l := ls[i]
		if l.ID != w.id || l.Parent != w.parent || l.Scope != w.scope || !l.ExpiresAt.Equal(w.expires) || l.SandboxID != id {
			t.Errorf("lease %d: %+v, want %+v", i, l, w)
		}
	}
	// Revoking a lease already revoked finds nothing.
	_, err = e.svc.Revoke(ctx, lease(a.Token), id, ch[1].LeaseID)
	wantKind(t, err, providers.ErrNotFound)
	// The owner may revoke its own lease, which ends every lease minted from it.
	if n, err := e.svc.Revoke(ctx, lease(a.Token), id, a.LeaseID); err != nil || n != 3 {
		t.Fatalf("owner revoking itself: %v, revoked %d, want 3", err, n)
	}
	wantRevoked(t, e.svc, id, a, op, side)
}

// TestRevokeRefusals: an operate lease can neither list nor revoke; an id
// that is not a live lease of the sandbox is 404 and changes nothing; a
// token never minted is 401.
func TestRevokeRefusals(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	b := e.create(t, CreateRequest{})
	id := a.SandboxID
	c := chain(t, e.svc, id, a.Token, 2)
	expiring, err := e.svc.Mint(ctx, lease(a.Token), id, ScopeOperate, dur(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	before := leaseIDs(t, e.svc, a.Token, id)

	_, err = e.svc.Leases(ctx, lease(c[0].Token), id)
	wantKind(t, err, providers.ErrForbidden)
	_, err = e.svc.Revoke(ctx, lease(c[0].Token), id, c[1].LeaseID)
	wantKind(t, err, providers.ErrForbidden)
	for _, bad := range []string{newLeaseID(), b.LeaseID, expiring.LeaseID, "release", ""} {
		_, err = e.svc.Revoke(ctx, lease(a.Token), id, bad)
		wantKind(t, err, providers.ErrNotFound)
	}
	never := lease(e.svc.sign.mint(claims{SandboxID: id, LeaseID: newLeaseID(), Scope: ScopeOwner}))
	_, err = e.svc.Leases(ctx, never, id)
	wantKind(t, err, providers.ErrUnauthorized)
	_, err = e.svc.Revoke(ctx, never, id, c[0].LeaseID)
	wantKind(t, err, providers.ErrUnauthorized)

	if after := leaseIDs(t, e.svc, a.Token, id); !slices.Equal(before, after) || len(after) != 3 {
		t.Fatalf("leases %v after refused calls, were %v", after, before)
	}
	wantLive(t, e.svc, id, c...)
	wantLive(t, e.svc, b.SandboxID, b)
}

// TestSubtreeRevokedOnReplica: a tree minted across two replicas of one
// shared store, released on one, is refused by the other at once; a
// revocation there is seen here too; and a lease a replica stored under a
// lease being revoked (the race of a mint with a revocation) is refused
// as the rest of the subtree.
func TestSubtreeRevokedOnReplica(t *testing.T) {
	a, b, _, st, _ := replicas(t)
	ctx := context.Background()
	ref, err := a.Create(ctx, Caller{}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := ref.SandboxID
	op := chain(t, a, id, ref.Token, 1)[0]
	ch := chain(t, b, id, op.Token, 1)[0]
	ch2 := chain(t, a, id, ch.Token, 1)[0]
	wantLive(t, b, id, op, ch, ch2)

	if left, err := b.Release(ctx, lease(op.Token), id); err != nil || left != 1 {
		t.Fatalf("release OP on B: %v, %d left", err, left)
	}
	wantRevoked(t, a, id, op, ch, ch2)
	wantRevoked(t, b, id, op, ch, ch2)

	x := chain(t, a, id, ref.Token, 2)
	if n, err := a.Revoke(ctx, lease(ref.Token), id, x[0].LeaseID); err != nil || n != 2 {
		t.Fatalf("revoke on A: %v, %d", err, n)
	}
	wantRevoked(t, b, id, x...)

	// B mints under X while A revokes X: the child lands after the subtree
	// went. Its parent is gone, so it is revoked too, on both replicas.
	orphan := Lease{ID: newLeaseID(), SandboxID: id, Scope: ScopeOperate, CreatedAt: time.Unix(1_800_000_000, 0), Parent: x[1].LeaseID}
	if err := st.PutLease(context.Background(), orphan); err != nil {
		t.Fatal(err)
	}
	orphanRef := b.ref(Record{ID: id}, orphan)
	wantRevoked(t, a, id, orphanRef)
	wantRevoked(t, b, id, orphanRef)
	if got := leaseIDs(t, b, ref.Token, id); len(got) != 1 {
		t.Fatalf("B lists %v, want the owner's lease only", got)
	}
	wantLive(t, a, id, ref)
}

// TestLeaseWithoutParentLoads: a lease stored before parents were
// recorded loads as a root: it works, lists with no parent and outlives a
// revocation of the create's lease.
func TestLeaseWithoutParentLoads(t *testing.T) {
	e := newEnv(t, nil)
	a := e.create(t, CreateRequest{})
	id := a.SandboxID
	e.svc.Close()
	old := Lease{ID: newLeaseID(), SandboxID: id, Scope: ScopeOperate, CreatedAt: e.clock.Now()}
	// Written as the store of that time did, straight into the file.
	db, err := bolt.Open(filepath.Join(e.dir, store.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := fmt.Sprintf(`{"id":%q,"sandbox_id":%q,"scope":"operate","created_at":%q,"expires_at":"0001-01-01T00:00:00Z"}`,
		old.ID, id, old.CreatedAt.UTC().Format(time.RFC3339Nano))
	err = db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("leases")).Bucket([]byte(id)).Put([]byte(old.ID), []byte(raw))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	oldRef := e.svc.ref(Record{ID: id}, old)
	wantLive(t, e.svc, id, oldRef)
	if got := leaseIDs(t, e.svc, a.Token, id); !slices.Contains(got, old.ID+"<-") {
		t.Fatalf("leases %v: the old lease is not a root", got)
	}
	if n, err := e.svc.Revoke(context.Background(), lease(a.Token), id, a.LeaseID); err != nil || n != 1 {
		t.Fatalf("revoke the create's lease: %v, %d", err, n)
	}
	wantLive(t, e.svc, id, oldRef)
}
