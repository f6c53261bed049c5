package e2b

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestWatchRPCs: WatchDir streams a start event then the changes, with
// keepalives; a watcher (CreateWatcher) queues its events for
// GetWatcherEvents until RemoveWatcher; bad input is refused with the
// codes the SDKs turn into their errors. (The fake provider's agent
// serves host paths: the directories here are the test's own.)
func TestWatchRPCs(t *testing.T) {
	t.Parallel()
	f := newFace(t)
	ctx := testkit.Context(t, time.Minute)
	ref, err := f.svc.Create(ctx, sandbox.Caller{Bearer: testKey}, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, fsys := f.dataPlane(map[string]string{"E2b-Sandbox-Id": ref.SandboxID, "X-Access-Token": ref.Token, "Keepalive-Ping-Interval": "1"})
	dir := t.TempDir()

	st, err := fsys.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir}))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetStart() == nil {
		t.Fatalf("the first message is not the start: %v %v", st.Msg(), st.Err())
	}
	if err := os.WriteFile(filepath.Join(dir, "a"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for st.Receive() {
		if e := st.Msg().GetFilesystem(); e != nil {
			if e.Name != "a" || e.Type != filesystem.EventType_EVENT_TYPE_CREATE {
				t.Errorf("event %v", e)
			}
			kinds = append(kinds, "event")
		} else if st.Msg().GetKeepalive() != nil {
			kinds = append(kinds, "keepalive")
			break
		}
	}
	st.Close()
	if strings.Join(kinds, ",") != "event,keepalive" {
		t.Errorf("stream: %v (%v)", kinds, st.Err())
	}

	cw, err := fsys.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	wid := cw.Msg.WatcherId
	if err := os.WriteFile(filepath.Join(dir, "b"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the watcher's event", 10*time.Second, func() bool {
		res, err := fsys.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Msg.Events {
			if e.Name == "b" && e.Type == filesystem.EventType_EVENT_TYPE_CREATE {
				return true
			}
		}
		return false
	})
	if _, err := fsys.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: wid})); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(dir, "b")
	for name, c := range map[string]struct {
		call func() error
		want connect.Code
	}{
		"WatchDir of a missing directory": {func() error {
			st, err := fsys.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir + "/missing"}))
			if err != nil {
				return err
			}
			defer st.Close()
			for st.Receive() {
			}
			return st.Err()
		}, connect.CodeNotFound},
		"CreateWatcher of a file": {func() error {
			_, err := fsys.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: file}))
			return err
		}, connect.CodeInvalidArgument},
		"CreateWatcher without a path": {func() error {
			_, err := fsys.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{}))
			return err
		}, connect.CodeInvalidArgument},
		"CreateWatcher with include_entry": {func() error {
			_, err := fsys.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, IncludeEntry: true}))
			return err
		}, connect.CodeUnimplemented},
		"GetWatcherEvents of a removed watcher": {func() error {
			_, err := fsys.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
			return err
		}, connect.CodeNotFound},
		"RemoveWatcher of a malformed id": {func() error {
			_, err := fsys.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: "../x"}))
			return err
		}, connect.CodeNotFound},
	} {
		if err := c.call(); codeOf(err) != c.want {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}
