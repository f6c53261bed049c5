package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// watching is a watch running in the background of a test: its events
// as they arrive, and its end.
type watching struct {
	mu     sync.Mutex
	events []agentwire.WatchEvent
	more   chan struct{} // a token per batch
	done   chan error
	cancel context.CancelFunc
}

// startWatch starts a watch of req and returns once it is in place (or
// fails the test with the watch's error).
func startWatch(t *testing.T, c *agentclient.Client, req agentwire.WatchRequest, gate <-chan struct{}) *watching {
	t.Helper()
	ctx, cancel := context.WithCancel(testkit.Context(t, time.Minute))
	w := &watching{more: make(chan struct{}, 1), done: make(chan error, 1), cancel: cancel}
	started := make(chan struct{})
	go func() {
		w.done <- c.Watch(ctx, req, func() error { close(started); return nil }, func(evs []agentwire.WatchEvent) error {
			if gate != nil {
				<-gate
			}
			w.mu.Lock()
			w.events = append(w.events, evs...)
			w.mu.Unlock()
			select {
			case w.more <- struct{}{}:
			default:
			}
			return nil
		})
	}()
	select {
	case <-started:
	case err := <-w.done:
		cancel()
		t.Fatalf("watch %s: %v", req.Path, err)
	}
	t.Cleanup(func() {
		cancel()
		<-w.done
	})
	return w
}

// waitFor waits until the watch saw every event of want (in that order,
// others between allowed).
func (w *watching) waitFor(t *testing.T, want ...agentwire.WatchEvent) {
	t.Helper()
	testkit.Eventually(t, fmt.Sprintf("events %v", want), 10*time.Second, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		i := 0
		for _, ev := range w.events {
			if i < len(want) && ev == want[i] {
				i++
			}
		}
		return i == len(want)
	})
}

// ended waits for the watch to end by itself and returns its error.
func (w *watching) ended(t *testing.T) error {
	t.Helper()
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not end")
		return nil
	}
}

func (w *watching) seen() []agentwire.WatchEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events)
}

func ev(name, op string) agentwire.WatchEvent { return agentwire.WatchEvent{Name: name, Op: op} }

// TestWatchEvents: each kind of change in a watched directory arrives as
// its event, named relative to the directory; a subdirectory's contents
// are not watched without recursive.
func TestWatchEvents(t *testing.T) {
	t.Parallel()
	_, c := pair(t)
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	w := startWatch(t, c, agentwire.WatchRequest{Path: dir}, nil)

	f := filepath.Join(dir, "a.txt")
	must(t, os.WriteFile(f, []byte("x"), 0o644))
	must(t, os.Chmod(f, 0o600))
	must(t, os.Rename(f, filepath.Join(dir, "b.txt")))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "unseen"), nil, 0o644))
	must(t, os.Remove(filepath.Join(dir, "b.txt")))
	must(t, os.WriteFile(filepath.Join(dir, "last"), nil, 0o644))
	w.waitFor(t,
		ev("a.txt", agentwire.WatchCreate), ev("a.txt", agentwire.WatchWrite), ev("a.txt", agentwire.WatchChmod),
		ev("a.txt", agentwire.WatchRename), ev("b.txt", agentwire.WatchCreate), ev("b.txt", agentwire.WatchRemove),
		ev("last", agentwire.WatchCreate))
	for _, e := range w.seen() {
		if strings.HasPrefix(e.Name, "sub/") {
			t.Errorf("a change in a subdirectory of a watch that is not recursive: %v", e)
		}
	}
}

// TestWatchRecursive: a recursive watch watches the tree it found and
// the directories that appear in it (made, or moved in), names them by
// their path under the watched directory, follows a directory renamed
// inside the tree, and stops watching one moved out of it.
func TestWatchRecursive(t *testing.T) {
	t.Parallel()
	_, c := pair(t)
	base := t.TempDir()
	dir := filepath.Join(base, "w")
	must(t, os.MkdirAll(filepath.Join(dir, "old", "deep"), 0o755))
	w := startWatch(t, c, agentwire.WatchRequest{Path: dir, Recursive: true}, nil)

	must(t, os.WriteFile(filepath.Join(dir, "old", "deep", "f"), nil, 0o644))
	w.waitFor(t, ev("old/deep/f", agentwire.WatchCreate))
	must(t, os.Mkdir(filepath.Join(dir, "new"), 0o755))
	w.waitFor(t, ev("new", agentwire.WatchCreate))
	must(t, os.WriteFile(filepath.Join(dir, "new", "g"), nil, 0o644))
	w.waitFor(t, ev("new/g", agentwire.WatchCreate))

	must(t, os.Rename(filepath.Join(dir, "old"), filepath.Join(dir, "renamed")))
	must(t, os.WriteFile(filepath.Join(dir, "renamed", "deep", "h"), nil, 0o644))
	w.waitFor(t, ev("old", agentwire.WatchRename), ev("renamed", agentwire.WatchCreate), ev("renamed/deep/h", agentwire.WatchCreate))

	must(t, os.MkdirAll(filepath.Join(base, "outside", "in"), 0o755))
	must(t, os.Rename(filepath.Join(base, "outside"), filepath.Join(dir, "arrived")))
	must(t, os.WriteFile(filepath.Join(dir, "arrived", "in", "i"), nil, 0o644))
	w.waitFor(t, ev("arrived", agentwire.WatchCreate), ev("arrived/in/i", agentwire.WatchCreate))

	must(t, os.Rename(filepath.Join(dir, "new"), filepath.Join(base, "gone")))
	must(t, os.WriteFile(filepath.Join(base, "gone", "after"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "marker"), nil, 0o644))
	w.waitFor(t, ev("new", agentwire.WatchRename), ev("marker", agentwire.WatchCreate))
	for _, e := range w.seen() {
		if strings.HasSuffix(e.Name, "after") {
			t.Errorf("a change in a directory moved out of the watched tree: %v", e)
		}
	}
}

// TestWatchSymlinksStayInside: a hostile sandbox links /proc and a path
// outside the watched tree into it: a recursive watch reports the links
// as entries and never watches what they point to.
func TestWatchSymlinksStayInside(t *testing.T) {
	t.Parallel()
	_, c := pair(t)
	dir, outside := t.TempDir(), t.TempDir()
	must(t, os.Symlink("/proc", filepath.Join(dir, "proc")))
	must(t, os.Symlink(outside, filepath.Join(dir, "host")))
	w := startWatch(t, c, agentwire.WatchRequest{Path: dir, Recursive: true}, nil)

	must(t, os.Symlink("/", filepath.Join(dir, "root")))
	must(t, os.WriteFile(filepath.Join(outside, "secret"), nil, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "marker"), nil, 0o644))
	w.waitFor(t, ev("root", agentwire.WatchCreate), ev("marker", agentwire.WatchCreate))
	for _, e := range w.seen() {
		if strings.Contains(e.Name, "/") {
			t.Errorf("an event through a symlink: %v", e)
		}
	}
}

// TestWatchRootRemoved: removing the watched directory ends the watch
// with ErrNotFound, after the events of what was in it.
func TestWatchRootRemoved(t *testing.T) {
	t.Parallel()
	_, c := pair(t)
	dir := filepath.Join(t.TempDir(), "w")
	must(t, os.MkdirAll(filepath.Join(dir, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "sub", "f"), nil, 0o644))
	w := startWatch(t, c, agentwire.WatchRequest{Path: dir, Recursive: true}, nil)
	must(t, os.RemoveAll(dir))
	if err := w.ended(t); providers.Kind(err) != providers.ErrNotFound || !strings.Contains(err.Error(), "was removed") {
		t.Errorf("a watch of a removed directory ended with %v", err)
	}
	if evs := w.seen(); !slices.Contains(evs, ev("sub/f", agentwire.WatchRemove)) || !slices.Contains(evs, ev("sub", agentwire.WatchRemove)) {
		t.Errorf("events before the end: %v", evs)
	}
}

// TestWatchCancel: the gateway closing the watch, or its connection,
// ends it in the agent:
// its inotify instance closed, its goroutines gone (goleak), its counts
// given back.
func TestWatchCancel(t *testing.T) {
	t.Parallel()
	srv, c := pair(t)
	dir := t.TempDir()
	before := openFDs(t)
	w := startWatch(t, c, agentwire.WatchRequest{Path: dir, Recursive: true}, nil)
	if n := srv.wl.counts(); n != [2]int{1, 1} {
		t.Errorf("watches, directories: %v, want [1 1]", n)
	}
	w.cancel()
	if err := <-w.done; !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled watch returned %v", err)
	}
	w.done <- nil // for the cleanup
	testkit.Eventually(t, "the agent ended the watch", 10*time.Second, func() bool { return srv.wl.counts() == [2]int{} })
	testkit.Eventually(t, "the descriptors closed", 10*time.Second, func() bool { return openFDs(t) <= before })

	// The gateway gone (its connection closed, as when it is killed):
	// the watch ends too.
	startWatch(t, c, agentwire.WatchRequest{Path: dir}, nil)
	c.Close()
	testkit.Eventually(t, "the agent ended the watch of a closed connection", 10*time.Second, func() bool { return srv.wl.counts() == [2]int{} })
}

// TestWatchBadInput: a missing path, a file, a relative path: each a
// clear error of its kind, and nothing left watched.
func TestWatchBadInput(t *testing.T) {
	t.Parallel()
	srv, c := pair(t)
	ctx := testkit.Context(t, time.Minute)
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	must(t, os.WriteFile(f, nil, 0o644))
	for _, tc := range []struct {
		path string
		kind error
		msg  string
	}{
		{filepath.Join(dir, "missing"), providers.ErrNotFound, "does not exist"},
		{f, providers.ErrInvalid, "is not a directory"},
		{"relative/dir", providers.ErrInvalid, "not absolute"},
	} {
		err := c.Watch(ctx, agentwire.WatchRequest{Path: tc.path}, func() error {
			return errors.New("started")
		}, nil)
		if providers.Kind(err) != tc.kind || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("watch %s: %v, want %v (%q)", tc.path, err, tc.kind, tc.msg)
		}
	}
	if n := srv.wl.counts(); n != [2]int{} {
		t.Errorf("after refused watches: %v held", n)
	}
}

// TestWatchCaps: past the cap of watches per sandbox, of directories per
// watch (at the start, and as directories appear), each a clear
// ErrTooMany; the counts come back when the watches end.
func TestWatchCaps(t *testing.T) {
	t.Parallel()
	srv, c := pair(t)
	srv.wl.maxWatches, srv.wl.maxEach = 2, 3
	ctx := testkit.Context(t, time.Minute)
	tree := t.TempDir()
	for _, d := range []string{"a", "b", "c"} {
		must(t, os.Mkdir(filepath.Join(tree, d), 0o755))
	}
	err := c.Watch(ctx, agentwire.WatchRequest{Path: tree, Recursive: true}, func() error { return errors.New("started") }, nil)
	if providers.Kind(err) != providers.ErrTooMany || !strings.Contains(err.Error(), "more than 3 directories") {
		t.Errorf("a tree of 4 directories under a cap of 3: %v", err)
	}

	small := t.TempDir()
	must(t, os.Mkdir(filepath.Join(small, "a"), 0o755))
	w := startWatch(t, c, agentwire.WatchRequest{Path: small, Recursive: true}, nil)
	startWatch(t, c, agentwire.WatchRequest{Path: t.TempDir()}, nil)
	err = c.Watch(ctx, agentwire.WatchRequest{Path: t.TempDir()}, func() error { return errors.New("started") }, nil)
	if providers.Kind(err) != providers.ErrTooMany || !strings.Contains(err.Error(), "2 directory watches already") {
		t.Errorf("a third watch under a cap of 2: %v", err)
	}

	must(t, os.Mkdir(filepath.Join(small, "b"), 0o755)) // the third directory: watched
	must(t, os.Mkdir(filepath.Join(small, "c"), 0o755)) // the fourth: the watch ends
	if err := w.ended(t); providers.Kind(err) != providers.ErrTooMany || !strings.Contains(err.Error(), "more than 3 directories") {
		t.Errorf("a watch that grew past its cap ended with %v", err)
	}
	if evs := w.seen(); !slices.Contains(evs, ev("c", agentwire.WatchCreate)) {
		t.Errorf("the event of the directory past the cap was not sent before the end: %v", evs)
	}
}

// TestWatchOverflow: a client that stops taking a stream's events while
// more come than the agent's queue holds gets its watch ended with an
// overflow (ErrTooMany, "events were lost") after the events before it,
// none lost among those: the agent does not buffer without bound. The
// stream is a pipe the test reads (or not) itself.
func TestWatchOverflow(t *testing.T) {
	t.Parallel()
	srv := NewServer(true)
	t.Cleanup(srv.Close)
	srv.wl.maxQueue = 16
	dir := t.TempDir()
	a, b := net.Pipe() // unbuffered: the agent's writes wait for the test's reads
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.watchDir(a, agentwire.Request{Op: agentwire.OpWatch, Watch: &agentwire.WatchRequest{Path: dir}})
	}()
	defer func() {
		b.Close()
		<-served
	}()
	var rep agentwire.Reply
	if err := agentwire.ReadMsg(b, &rep, agentwire.MaxReply); err != nil || rep.Error != "" {
		t.Fatalf("the watch's reply: %+v %v", rep, err)
	}
	for i := range 100 {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%05d", i)))
		must(t, err)
		f.Close()
	}
	testkit.Eventually(t, "the queue's overflow", 10*time.Second, func() bool {
		srv.wl.mu.Lock()
		defer srv.wl.mu.Unlock()
		return srv.wl.overflows == 1
	})
	var evs []agentwire.WatchEvent
	first := -1 // the events of the frame the agent was stuck writing
	for {
		typ, p, err := agentwire.ReadFrame(b, nil)
		if err != nil {
			t.Fatalf("after %d events: %v", len(evs), err)
		}
		if typ == agentwire.FrameWatchEnd {
			var end agentwire.WatchEnd
			json.Unmarshal(p, &end)
			if end.Kind != "too_many" || !strings.Contains(end.Error, "events were lost") {
				t.Errorf("the end of an overflowed watch: %+v", end)
			}
			break
		}
		var batch []agentwire.WatchEvent
		must(t, json.Unmarshal(p, &batch))
		evs = append(evs, batch...)
		if first < 0 {
			first = len(batch)
		}
	}
	if len(evs) == 0 || len(evs) > first+16 {
		t.Errorf("%d events before the overflow: more than the frame the client stopped at (%d) and a queue of 16", len(evs), first)
	}
	for i, e := range evs {
		if e != ev(fmt.Sprintf("f%05d", i), agentwire.WatchCreate) {
			t.Fatalf("event %d before the overflow: %v (none may be lost before it)", i, e)
		}
	}
	<-served
	if n := srv.wl.counts(); n != [2]int{} {
		t.Errorf("after the overflow: %v held", n)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
