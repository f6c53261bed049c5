package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
)

// TestDockerSnapshotFork: on a real daemon through a real gateway, a
// snapshot and a fork x10: every fork starts with the source's files as of
// the snapshot, keeps its writes to itself, refuses the source's lease;
// a named snapshot survives a gateway restart, makes sandboxes, and its
// delete while one of them lives is deferred.
func TestDockerSnapshotFork(t *testing.T) {
	t.Parallel()
	snapshotFork(t, func(state string) *proc { return startDockerGateway(t, state) },
		func(g *proc, members string) dkBox { return dkCreate(t, g, members) })
}

// TestLocalSnapshotFork is TestDockerSnapshotFork on the local provider
// (btrfs snapshot layers).
func TestLocalSnapshotFork(t *testing.T) {
	t.Parallel()
	snapshotFork(t, func(state string) *proc { return startGateway(t, state, nil) },
		func(g *proc, members string) dkBox { return createFrom(t, g, members) })
}

func snapshotFork(t *testing.T, start func(state string) *proc, create func(g *proc, members string) dkBox) {
	state := t.TempDir()
	g := start(state)
	sb := create(g, `"workdir":"/work","env":{"FROM":"source"}`)
	dkRun(t, sb, "echo v1 > a.txt")

	s, body := call(t, "POST", sb.url+"/snapshots", `{"name":"clean"}`, "X-Sandbox-Lease", sb.token)
	var snap struct {
		ID   string `json:"snapshot_id"`
		Name string `json:"name"`
	}
	if json.Unmarshal(body, &snap); s != 201 || snap.Name != "clean" || !strings.HasPrefix(snap.ID, "snp-") {
		t.Fatalf("snapshot: %d %s", s, body)
	}
	if s, body := call(t, "POST", sb.url+"/fork", `{"count":0}`, "X-Sandbox-Lease", sb.token); s != 422 {
		t.Fatalf("fork of 0: %d %s", s, body)
	}
	s, body = call(t, "POST", sb.url+"/fork", `{"count":10}`, "X-Sandbox-Lease", sb.token)
	var fork struct {
		Sandboxes []struct {
			ID    string `json:"sandbox_id"`
			Token string `json:"lease_token"`
		} `json:"sandboxes"`
	}
	if json.Unmarshal(body, &fork); s != 201 || len(fork.Sandboxes) != 10 {
		t.Fatalf("fork: %d %s", s, body)
	}
	dkRun(t, sb, "echo v2 > a.txt")
	forks := make([]dkBox, len(fork.Sandboxes))
	for i, f := range fork.Sandboxes {
		forks[i] = dkBox{url: g.URL + "/v1/sandboxes/" + f.ID, id: f.ID, token: f.Token}
	}
	dkRun(t, forks[0], "echo mine > a.txt")
	for i, f := range forks {
		want := "v1\n/work source\n"
		if i == 0 {
			want = "mine\n/work source\n"
		}
		if got := dkRun(t, f, "cat a.txt; echo $(pwd) $FROM"); got != want {
			t.Fatalf("fork %d: %q, want %q", i, got, want)
		}
	}
	if got := dkRun(t, sb, "cat a.txt"); got != "v2\n" {
		t.Fatalf("the source: %q", got)
	}
	if s, body := call(t, "POST", forks[1].url+"/exec", `{"command":"true"}`, "X-Sandbox-Lease", sb.token); s != 403 {
		t.Fatalf("the source's lease on a fork: %d %s", s, body)
	}

	// The named snapshot, across a restart.
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	g = start(state)
	if s, body := call(t, "GET", g.URL+"/v1/snapshots", ""); s != 200 || !strings.Contains(string(body), snap.ID) || strings.Count(string(body), "snapshot_id") != 1 {
		t.Fatalf("list after the restart: %d %s (want the named snapshot only)", s, body)
	}
	from := createFrom(t, g, `"snapshot_id":"`+snap.ID+`"`)
	if got := dkRun(t, from, "cat a.txt"); got != "v1\n" {
		t.Fatalf("made from the snapshot: %q", got)
	}
	if s, body := call(t, "DELETE", g.URL+"/v1/snapshots/"+snap.ID, ""); s != 200 || !strings.Contains(string(body), `"deferred":true`) {
		t.Fatalf("delete of a snapshot in use: %d %s", s, body)
	}
	if s, body := call(t, "DELETE", from.url, "", "X-Sandbox-Lease", from.token); s != 200 {
		t.Fatalf("delete: %d %s", s, body)
	}
	if s, body := call(t, "DELETE", g.URL+"/v1/snapshots/"+snap.ID, ""); s != 200 {
		t.Fatalf("delete of the snapshot: %d %s", s, body)
	}
	if s, _ := call(t, "GET", g.URL+"/v1/snapshots/"+snap.ID, ""); s != 404 {
		t.Fatalf("the deleted snapshot: %d", s)
	}
	if s, _ := call(t, "GET", g.URL+"/v1/snapshots/not-a-snapshot", ""); s != 400 {
		t.Fatalf("a malformed snapshot id: %d, want 400", s)
	}
}

// createFrom creates a sandbox through g from the request members alone (no
// image: a snapshot's).
func createFrom(t *testing.T, g *proc, members string) dkBox {
	t.Helper()
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", "{"+members+"}")
	var ref struct {
		ID    string `json:"sandbox_id"`
		Token string `json:"lease_token"`
	}
	if json.Unmarshal(b, &ref); s != 201 || ref.ID == "" {
		t.Fatalf("create: %d %s", s, b)
	}
	return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
}
