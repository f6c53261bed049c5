package sandbox

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

func (e *env) write(t *testing.T, c Caller, id, p, data string) {
	t.Helper()
	if _, _, err := e.svc.WriteFile(context.Background(), c, id, p, strings.NewReader(data)); err != nil {
		t.Fatalf("write %s in %s: %v", p, id, err)
	}
}

func (e *env) read(t *testing.T, c Caller, id, p string) string {
	t.Helper()
	r, _, err := e.svc.ReadFile(context.Background(), c, id, p, 1<<20)
	if err != nil {
		t.Fatalf("read %s in %s: %v", p, id, err)
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

// Snapshot -> fork x10: each fork sees the source's files as of the
// snapshot; a fork's writes reach neither the others nor the source; the
// source's lease does not work on a fork; forks outlive the source; the
// internal snapshot goes with the last fork.
func TestForkIsolation(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.APIKeys = []string{"k1"} })
	ctx := context.Background()
	src, err := e.svc.Create(ctx, Caller{Bearer: "k1"}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	owner := lease(src.Token)
	e.write(t, owner, src.SandboxID, "a.txt", "v1")
	forks, err := e.svc.Fork(ctx, owner, src.SandboxID, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(forks) != 10 {
		t.Fatalf("%d forks", len(forks))
	}
	e.write(t, owner, src.SandboxID, "a.txt", "v2")
	e.write(t, lease(forks[0].Token), forks[0].SandboxID, "a.txt", "fork0")
	for i, f := range forks {
		want := "v1"
		if i == 0 {
			want = "fork0"
		}
		if got := e.read(t, lease(f.Token), f.SandboxID, "a.txt"); got != want {
			t.Fatalf("fork %d reads %q, want %q", i, got, want)
		}
		if f.SandboxID == src.SandboxID || f.Scope != ScopeOwner {
			t.Fatalf("fork %d: %+v", i, f)
		}
	}
	if got := e.read(t, owner, src.SandboxID, "a.txt"); got != "v2" {
		t.Fatalf("the source reads %q", got)
	}
	_, err = e.svc.Exec(ctx, owner, forks[1].SandboxID, ExecRequest{Command: "true"})
	wantKind(t, err, providers.ErrForbidden)
	if sns, _ := e.svc.Snapshots(ctx, Caller{Bearer: "k1"}); len(sns) != 0 {
		t.Fatalf("a fork's snapshot is listed: %v", sns)
	}
	// The forks belong to the source's key.
	if l, _ := e.svc.List(ctx, Caller{Bearer: "k1"}, ListFilter{}); len(l) != 11 {
		t.Fatalf("the key lists %d sandboxes, want 11", len(l))
	}
	if err := e.svc.Delete(ctx, owner, src.SandboxID); err != nil {
		t.Fatal(err)
	}
	if got := e.read(t, lease(forks[5].Token), forks[5].SandboxID, "a.txt"); got != "v1" {
		t.Fatalf("after the source's delete a fork reads %q", got)
	}
	for _, f := range forks {
		if len(e.p.Snapshots()) != 1 {
			t.Fatalf("snapshots %v before the last fork went", e.p.Snapshots())
		}
		if err := e.svc.Delete(ctx, lease(f.Token), f.SandboxID); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.p.Snapshots(); len(s) != 0 {
		t.Fatalf("the fork's snapshot outlived its forks: %v", s)
	}
}

// A named snapshot: listed and read by its key only, a create from it
// (either form), kept across a restart, deleted once no sandbox made
// from it is left (TestSnapshotDeleteDeferred covers a delete before).
func TestSnapshotLifecycle(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.APIKeys = []string{"k1", "k2"} })
	ctx := context.Background()
	k1, k2 := Caller{Bearer: "k1"}, Caller{Bearer: "k2"}
	src, err := e.svc.Create(ctx, k1, CreateRequest{Workdir: "/work"})
	if err != nil {
		t.Fatal(err)
	}
	e.write(t, lease(src.Token), src.SandboxID, "seed", "seeded")
	op, err := e.svc.Mint(ctx, lease(src.Token), src.SandboxID, ScopeOperate, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.Snapshot(ctx, lease(op.Token), src.SandboxID, "x")
	wantKind(t, err, providers.ErrForbidden)
	_, err = e.svc.Snapshot(ctx, lease(src.Token), src.SandboxID, strings.Repeat("n", 129))
	wantKind(t, err, providers.ErrInvalid)
	sn, err := e.svc.Snapshot(ctx, lease(src.Token), src.SandboxID, "clean")
	if err != nil {
		t.Fatal(err)
	}
	if sn.Name != "clean" || sn.SandboxID != src.SandboxID || sn.SizeBytes != 6 || !strings.HasPrefix(sn.ID, "snp-") {
		t.Fatalf("snapshot %+v", sn)
	}
	if l, _ := e.svc.Snapshots(ctx, k1); len(l) != 1 || l[0].ID != sn.ID {
		t.Fatalf("k1 lists %v", l)
	}
	if l, _ := e.svc.Snapshots(ctx, k2); len(l) != 0 {
		t.Fatalf("k2 lists %v", l)
	}
	_, err = e.svc.GetSnapshot(ctx, k2, sn.ID)
	wantKind(t, err, providers.ErrNotFound)
	_, err = e.svc.Create(ctx, k2, CreateRequest{SnapshotID: sn.ID})
	wantKind(t, err, providers.ErrNotFound)
	_, err = e.svc.Create(ctx, k1, CreateRequest{SnapshotID: "snp-nosuchsnapshotxxxxx"})
	wantKind(t, err, providers.ErrNotFound)
	_, err = e.svc.Create(ctx, k1, CreateRequest{SnapshotID: sn.ID, ProviderOptions: map[string]any{"snapshot_id": "snp-other"}})
	wantKind(t, err, providers.ErrInvalid)

	a, err := e.svc.Create(ctx, k1, CreateRequest{SnapshotID: sn.ID})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.svc.Create(ctx, k1, CreateRequest{ProviderOptions: map[string]any{"snapshot_id": sn.ID}})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Ref{a, b} {
		if r.Workdir != "/work" || e.read(t, lease(r.Token), r.SandboxID, "seed") != "seeded" {
			t.Fatalf("made from the snapshot: %+v", r)
		}
	}
	e.restart(t)
	if got, err := e.svc.GetSnapshot(ctx, k1, sn.ID); err != nil || got.Name != "clean" {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	for _, r := range []Ref{a, b} {
		if err := e.svc.Delete(ctx, lease(r.Token), r.SandboxID); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := e.svc.DeleteSnapshot(ctx, k2, sn.ID); err != nil || d != (SnapshotDeletion{}) {
		t.Fatalf("another key's delete: %+v %v", d, err)
	}
	if d, err := e.svc.DeleteSnapshot(ctx, k1, sn.ID); err != nil || d != (SnapshotDeletion{Deleted: true}) {
		t.Fatalf("delete: %+v %v", d, err)
	}
	if s := e.p.Snapshots(); len(s) != 0 {
		t.Fatalf("provider still has %v", s)
	}
	_, err = e.svc.GetSnapshot(ctx, k1, sn.ID)
	wantKind(t, err, providers.ErrNotFound)
}

// A fork whose creates fail leaves nothing: no fork, no snapshot.
func TestForkAllOrNothing(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	src := e.create(t, CreateRequest{})
	_, err := e.svc.Fork(ctx, lease(src.Token), src.SandboxID, 0)
	wantKind(t, err, providers.ErrInvalid)
	_, err = e.svc.Fork(ctx, lease(src.Token), src.SandboxID, MaxFork+1)
	wantKind(t, err, providers.ErrInvalid)
	e.p.CreateErr = providers.Errorf(providers.ErrUnavailable, "backend down")
	_, err = e.svc.Fork(ctx, lease(src.Token), src.SandboxID, 3)
	wantKind(t, err, providers.ErrUnavailable)
	if l, _ := e.svc.List(ctx, Caller{}, ListFilter{}); len(l) != 1 {
		t.Fatalf("a failed fork left %d sandboxes", len(l)-1)
	}
	if s := e.p.Snapshots(); len(s) != 0 {
		t.Fatalf("a failed fork left its snapshot %v", s)
	}
}

// NeMo Gym's delete_snapshot: a delete may be repeated; another key's
// delete is an unknown id's and touches nothing; a delete while sandboxes
// made from the snapshot live succeeds at once (gone from list, get,
// creates and quota) and its storage goes with the last of them, across
// a restart too.
func TestSnapshotDeleteDeferred(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.APIKeys = []string{"k1", "k2"} })
	ctx := context.Background()
	k1, k2 := Caller{Bearer: "k1"}, Caller{Bearer: "k2"}
	src, err := e.svc.Create(ctx, k1, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	e.write(t, lease(src.Token), src.SandboxID, "seed", "seeded")
	sn, err := e.svc.Snapshot(ctx, lease(src.Token), src.SandboxID, "s")
	if err != nil {
		t.Fatal(err)
	}
	var users []Ref
	for range 2 {
		r, err := e.svc.Create(ctx, k1, CreateRequest{ProviderOptions: map[string]any{"snapshot_id": sn.ID}})
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, r)
	}

	for _, id := range []string{sn.ID, "snp-nosuchsnapshotxxxxx"} {
		if d, err := e.svc.DeleteSnapshot(ctx, k2, id); err != nil || d != (SnapshotDeletion{}) {
			t.Fatalf("k2 deletes %s: %+v %v", id, d, err)
		}
	}
	if _, err := e.svc.GetSnapshot(ctx, k1, sn.ID); err != nil {
		t.Fatalf("k2's delete reached k1's snapshot: %v", err)
	}
	if d, err := e.svc.DeleteSnapshot(ctx, k1, sn.ID); err != nil || d != (SnapshotDeletion{Deleted: true, Deferred: true}) {
		t.Fatalf("delete in use: %+v %v", d, err)
	}
	if d, err := e.svc.DeleteSnapshot(ctx, k1, sn.ID); err != nil || d.Deleted {
		t.Fatalf("repeated delete: %+v %v", d, err)
	}
	_, err = e.svc.GetSnapshot(ctx, k1, sn.ID)
	wantKind(t, err, providers.ErrNotFound)
	if l, _ := e.svc.Snapshots(ctx, k1); len(l) != 0 {
		t.Fatalf("a deleted snapshot is listed: %v", l)
	}
	if q, _ := e.svc.Quota(ctx, k1); q.Snapshots != 0 || q.SnapshotBytes != 0 {
		t.Fatalf("a deleted snapshot counts: %+v", q)
	}
	_, err = e.svc.Create(ctx, k1, CreateRequest{SnapshotID: sn.ID})
	wantKind(t, err, providers.ErrNotFound)
	for _, r := range users {
		if got := e.read(t, lease(r.Token), r.SandboxID, "seed"); got != "seeded" {
			t.Fatalf("a sandbox of the deleted snapshot reads %q", got)
		}
	}
	if s := e.p.Snapshots(); len(s) != 1 {
		t.Fatalf("the provider holds %v while sandboxes use it", s)
	}

	// One user goes while the gateway runs, the other while it is down.
	if err := e.svc.Delete(ctx, lease(users[0].Token), users[0].SandboxID); err != nil {
		t.Fatal(err)
	}
	if s := e.p.Snapshots(); len(s) != 1 {
		t.Fatalf("freed with a sandbox still using it: %v", s)
	}
	e.restart(t)
	if _, err := e.svc.GetSnapshot(ctx, k1, sn.ID); err == nil {
		t.Fatal("the deleted snapshot is back after a restart")
	}
	e.svc.Close()
	if err := e.p.Delete(ctx, users[1].SandboxID); err != nil {
		t.Fatal(err)
	}
	e.restart(t)
	if s := e.p.Snapshots(); len(s) != 0 {
		t.Fatalf("the restart left the snapshot's storage: %v", s)
	}

	// Without users: freed at once.
	sn2, err := e.svc.Snapshot(ctx, lease(src.Token), src.SandboxID, "")
	if err != nil {
		t.Fatal(err)
	}
	if d, err := e.svc.DeleteSnapshot(ctx, k1, sn2.ID); err != nil || d != (SnapshotDeletion{Deleted: true}) {
		t.Fatalf("delete unused: %+v %v", d, err)
	}
	if s := e.p.Snapshots(); len(s) != 0 {
		t.Fatalf("an unused deleted snapshot kept: %v", s)
	}
}
