package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/local"
	"github.com/sandgate/sandgate/internal/testkit"
)

// localSandboxes lists the local provider's sandboxes in a gateway's
// state dir (those with a record and those without: pool sandboxes).
func localSandboxes(t *testing.T, stateDir string) []string {
	t.Helper()
	l, err := local.New(local.Options{StateDir: filepath.Join(stateDir, "local")})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owned, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, o := range owned {
		ids = append(ids, o.ID)
	}
	return ids
}

// TestWarmPool: a gateway with --pool keeps its pool full, a matching
// create is served from it (and reported in the metrics), pool sandboxes
// are never listed, a SIGKILLed gateway's pool is deleted at the restart
// (orphans) and made anew, and a SIGTERM deletes it.
func TestWarmPool(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	g := startGateway(t, state, nil, "--pool", "workdir=/srv/app=2")
	metric := func(g *proc) string {
		_, b := call(t, "GET", g.URL+"/metrics", "")
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, `sandgate_pool_ready{spec="image=,workdir=/srv/app"}`) {
				return strings.Fields(line)[1]
			}
		}
		return ""
	}
	testkit.Eventually(t, "the pool to fill", time.Minute, func() bool { return metric(g) == "2" })
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"workdir":"/srv/app","env":{"GREETING":"hello"}}`)
	var ref struct {
		ID    string         `json:"sandbox_id"`
		Token string         `json:"lease_token"`
		Extra map[string]any `json:"extra"`
	}
	if json.Unmarshal(b, &ref); s != 201 || ref.Extra["warm_pool"] != true {
		t.Fatalf("create: %d %s", s, b)
	}
	sb := dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
	if got := dkRun(t, sb, "echo $GREETING $(pwd)"); got != "hello /srv/app\n" {
		t.Fatalf("claimed sandbox: %q", got)
	}
	if _, b := call(t, "GET", g.URL+"/metrics", ""); !strings.Contains(string(b), `sandgate_pool_claims_total{spec="image=,workdir=/srv/app"} 1`) {
		t.Fatal("no claim in the metrics")
	}
	testkit.Eventually(t, "the refill", time.Minute, func() bool { return metric(g) == "2" })
	if _, b := call(t, "GET", g.URL+"/v1/sandboxes", ""); strings.Count(string(b), `"sandbox_id"`) != 1 {
		t.Fatalf("list shows pool sandboxes: %s", b)
	}
	before := localSandboxes(t, state)
	if len(before) != 3 {
		t.Fatalf("%d sandboxes on disk, want the claimed one and 2 in the pool", len(before))
	}
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	g = startGateway(t, state, nil, "--pool", "workdir=/srv/app=2")
	testkit.Eventually(t, "the new pool", time.Minute, func() bool { return metric(g) == "2" })
	after := localSandboxes(t, state)
	for _, id := range before {
		if id != ref.ID && strings.Contains(strings.Join(after, " "), id) {
			t.Fatalf("the old pool's %s survived the restart", id)
		}
	}
	if len(after) != 3 {
		t.Fatalf("%d sandboxes after the restart, want 3", len(after))
	}
	if err := g.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if left := localSandboxes(t, state); len(left) != 1 || left[0] != ref.ID {
		t.Fatalf("after SIGTERM: %v, want only the claimed %s", left, ref.ID)
	}
}
