package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// pollUntil polls watcher id until its events include want (in order).
func pollUntil(t *testing.T, ctx context.Context, c *agentclient.Client, id string, want ...agentwire.WatchEvent) []agentwire.WatchEvent {
	t.Helper()
	var got []agentwire.WatchEvent
	testkit.EventuallyNil(t, "watcher events", 10*time.Second, func() error {
		evs, err := c.WatcherEvents(ctx, id)
		if err != nil {
			t.Fatalf("events of %s: %v", id, err)
		}
		got = append(got, evs...)
		i := 0
		for _, e := range got {
			if i < len(want) && e == want[i] {
				i++
			}
		}
		if i < len(want) {
			return errNotYet
		}
		return nil
	})
	return got
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet = notYet{}

// TestWatcher: a watcher queues its events between calls, each taken
// once; it outlives the connection that made it (a gateway restart);
// removing it ends it; an unknown one is ErrNotFound.
func TestWatcher(t *testing.T) {
	t.Parallel()
	srv := NewServer(true)
	t.Cleanup(srv.Close)
	dial := func() *agentclient.Client {
		return testkit.DialPipe(t, func(a net.Conn) { srv.Serve(a, nil) }, func(b net.Conn) (*agentclient.Client, error) {
			return agentclient.Dial(context.Background(), b)
		})
	}
	c := dial()
	ctx := testkit.Context(t, time.Minute)
	dir := t.TempDir()
	id, err := c.CreateWatcher(ctx, agentwire.WatchRequest{Path: dir, Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	pollUntil(t, ctx, c, id, ev("sub", agentwire.WatchCreate)) // then sub is watched
	must(t, os.WriteFile(filepath.Join(dir, "sub", "f"), []byte("x"), 0o644))
	pollUntil(t, ctx, c, id, ev("sub/f", agentwire.WatchCreate), ev("sub/f", agentwire.WatchWrite))
	if evs, err := c.WatcherEvents(ctx, id); err != nil || len(evs) != 0 {
		t.Errorf("events taken twice: %v %v", evs, err)
	}

	c.Close() // the gateway goes; the watcher stays
	c = dial()
	must(t, os.Remove(filepath.Join(dir, "sub", "f")))
	pollUntil(t, ctx, c, id, ev("sub/f", agentwire.WatchRemove))

	if err := c.RemoveWatcher(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{c.RemoveWatcher(ctx, id), func() error { _, err := c.WatcherEvents(ctx, id); return err }()} {
		if providers.Kind(err) != providers.ErrNotFound {
			t.Errorf("a removed watcher: %v, want not found", err)
		}
	}
	if n := srv.wl.counts(); n != [2]int{} {
		t.Errorf("after removal: %v held", n)
	}
	if _, err := c.CreateWatcher(ctx, agentwire.WatchRequest{Path: filepath.Join(dir, "missing")}); providers.Kind(err) != providers.ErrNotFound {
		t.Errorf("a watcher of a missing directory: %v", err)
	}
}

// TestWatcherEnds: a watcher whose directory is removed answers the
// events before, then the end (ErrNotFound), then is gone; one nobody
// reads is removed after the idle bound.
func TestWatcherEnds(t *testing.T) {
	t.Parallel()
	srv, c := pair(t)
	srv.wl.idle = 200 * time.Millisecond
	ctx := testkit.Context(t, time.Minute)
	dir := filepath.Join(t.TempDir(), "w")
	must(t, os.Mkdir(dir, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "f"), nil, 0o644))
	id, err := c.CreateWatcher(ctx, agentwire.WatchRequest{Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.RemoveAll(dir))
	var got []agentwire.WatchEvent
	testkit.Eventually(t, "the watcher's end", 10*time.Second, func() bool {
		evs, err := c.WatcherEvents(ctx, id)
		got = append(got, evs...)
		if err != nil {
			if providers.Kind(err) != providers.ErrNotFound || !strings.Contains(err.Error(), "was removed") {
				t.Fatalf("the end of a watcher of a removed directory: %v", err)
			}
			return true
		}
		return false
	})
	if !slices.Contains(got, ev("f", agentwire.WatchRemove)) {
		t.Errorf("the events before the end: %v", got)
	}

	idle, err := c.CreateWatcher(ctx, agentwire.WatchRequest{Path: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the unread watcher removed", 10*time.Second, func() bool {
		return srv.wl.counts() == [2]int{}
	})
	if _, err := c.WatcherEvents(ctx, idle); providers.Kind(err) != providers.ErrNotFound {
		t.Errorf("an expired watcher: %v", err)
	}
}

// TestWatcherOverflow: a watcher nobody reads while more events come
// than its queue holds ends with an overflow: the next read gets the
// queued events, the one after the overflow (ErrTooMany, "events were
// lost"), and the watcher is gone.
func TestWatcherOverflow(t *testing.T) {
	t.Parallel()
	srv, c := pair(t)
	srv.wl.maxQueue = 300 // more than one read of inotify's (64 KiB) holds
	ctx := testkit.Context(t, time.Minute)
	dir := t.TempDir()
	id, err := c.CreateWatcher(ctx, agentwire.WatchRequest{Path: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 400 {
		f, err := os.Create(filepath.Join(dir, strings.Repeat("n", 200)+strconv.Itoa(i)))
		must(t, err)
		f.Close()
	}
	testkit.Eventually(t, "the agent's queue overflowed", 10*time.Second, func() bool {
		srv.wl.mu.Lock()
		w := srv.wl.watchers[id]
		srv.wl.mu.Unlock()
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.end != nil
	})
	var got int
	testkit.Eventually(t, "the overflow", 10*time.Second, func() bool {
		evs, err := c.WatcherEvents(ctx, id)
		got += len(evs)
		if err != nil {
			if providers.Kind(err) != providers.ErrTooMany || !strings.Contains(err.Error(), "events were lost") {
				t.Fatalf("an overflowed watcher: %v", err)
			}
			return true
		}
		return false
	})
	if got != 300 {
		t.Errorf("%d events before the overflow, want the 300 queued", got)
	}
	if n := srv.wl.counts(); n != [2]int{} {
		t.Errorf("after the overflow: %v held", n)
	}
}
