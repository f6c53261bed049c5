package local

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestWatchNewDirectories: a recursive watch reports a file made in a
// directory the moment after the directory appears, on the sandbox's
// overlay root. The agent watches a new directory when its create
// arrives and lists it for what came before the watch; it listed through
// the opening made before the watch, which on the overlay missed a file
// created between that open and the watch (whose create came before the
// watch too): only the file's write was reported (the E2B SDK's test, one
// run in ~20 under load). Here 300 directories, each with a file made at
// once, give the race many chances.
func TestWatchNewDirectories(t *testing.T) {
	t.Parallel()
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{})
	if out, code := sh(t, l, id, "mkdir -p /tmp/w"); code != 0 {
		t.Fatalf("mkdir: %d %s", code, out)
	}
	c, err := l.Agent(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	var mu sync.Mutex
	created := map[string]bool{}
	started, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- c.Watch(ctx, agentclient.WatchRequest{Path: "/tmp/w", Recursive: true}, func() error { close(started); return nil },
			func(evs []agentwire.WatchEvent) error {
				mu.Lock()
				defer mu.Unlock()
				for _, e := range evs {
					if e.Op == agentwire.WatchCreate {
						created[e.Name] = true
					}
				}
				return nil
			})
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-started:
	case err := <-done:
		done <- err // for the deferred wait
		t.Fatalf("watch: %v", err)
	}
	const n = 300
	if out, code := sh(t, l, id, fmt.Sprintf("cd /tmp/w && i=0; while [ $i -lt %d ]; do mkdir d$i && echo y > d$i/f; i=$((i+1)); done", n)); code != 0 {
		t.Fatalf("the command: %d %s", code, out)
	}
	testkit.EventuallyNil(t, "a create for every file", 30*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		var missing []string
		for i := range n {
			if f := fmt.Sprintf("d%d/f", i); !created[f] {
				missing = append(missing, f)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("no create for %d files: %v", len(missing), missing[:min(len(missing), 10)])
		}
		return nil
	})
}
