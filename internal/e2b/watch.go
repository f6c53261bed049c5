package e2b

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// Watching a directory: envd's WatchDir stream (what the JS SDK's
// files.watchDir calls), over the service's WatchDir, which the
// sandbox's agent serves with inotify inside the sandbox. The gateway
// never resolves the path itself.

// watchEvents sends a watch's events.
type watchEvents = eventSender[*filesystem.WatchDirResponse]

// watchAlive is a watch stream's keepalive event.
var watchAlive = &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}

// eventTypes maps the agent's operations to envd's event types.
var eventTypes = map[string]filesystem.EventType{
	agentwire.WatchCreate: filesystem.EventType_EVENT_TYPE_CREATE,
	agentwire.WatchWrite:  filesystem.EventType_EVENT_TYPE_WRITE,
	agentwire.WatchRemove: filesystem.EventType_EVENT_TYPE_REMOVE,
	agentwire.WatchRename: filesystem.EventType_EVENT_TYPE_RENAME,
	agentwire.WatchChmod:  filesystem.EventType_EVENT_TYPE_CHMOD,
}

// fsEvent is ev as envd's FilesystemEvent: its name relative to the
// watched directory, as envd names it.
func fsEvent(ev sandbox.WatchEvent) *filesystem.FilesystemEvent {
	return &filesystem.FilesystemEvent{Name: ev.Name, Type: eventTypes[ev.Op]}
}

// checkWatch refuses what a watch cannot do: an empty path, and entry
// info with the events (envd 0.6.3's include_entry; the SDKs do not ask
// an envd of EnvdVersion for it).
func checkWatch(path string, includeEntry bool) error {
	switch {
	case path == "":
		return connect.NewError(connect.CodeInvalidArgument, errors.New("path must not be empty"))
	case includeEntry:
		return unsupported("include_entry (entry info with watch events)")
	}
	return nil
}

// WatchDir streams the changes under a directory: a start event once the
// watch is in place, then an event per change, with keepalives at the
// interval the client asks, until the client goes away (or its timeout
// passes) or the watch ends: ResourceExhausted when events were lost (an
// overflow) or a cap was reached, NotFound when the directory was
// removed. A missing directory is NotFound, a file or a path escaping the
// sandbox InvalidArgument, as the SDKs expect. allow_network_mounts is
// accepted: no filesystem is refused by kind but the kernel's own (/proc,
// /sys), and a recursive watch stays on the directory's filesystem.
func (f *filesystemServer) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], st *connect.ServerStream[filesystem.WatchDirResponse]) error {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return f.s.connectErr(err)
	}
	if err := checkWatch(req.Msg.Path, req.Msg.IncludeEntry); err != nil {
		return err
	}
	ev := &watchEvents{send: st.Send, alive: watchAlive}
	stop := func() {}
	err = f.s.svc.WatchDir(ctx, t.c, t.id, req.Msg.Path, req.Msg.Recursive, func(string) error {
		if err := ev.event(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
			return err
		}
		stop = ev.keepalive(req.Header())
		return nil
	}, func(evs []sandbox.WatchEvent) error {
		for _, e := range evs {
			if err := ev.event(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fsEvent(e)}}); err != nil {
				return err
			}
		}
		return nil
	})
	stop()
	if ctx.Err() != nil {
		return ctx.Err() // the client went away or its timeout passed
	}
	return f.s.connectErr(err)
}

// CreateWatcher starts a watcher of a directory (the Python SDK's
// synchronous watch_dir): the sandbox's agent holds it, its events queued
// (bounded: an overflow ends it) until GetWatcherEvents takes them, also
// across a gateway restart, until RemoveWatcher or ten minutes unread.
// Errors as WatchDir's.
func (f *filesystemServer) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	if err := checkWatch(req.Msg.Path, req.Msg.IncludeEntry); err != nil {
		return nil, err
	}
	wid, err := f.s.svc.CreateWatcher(ctx, t.c, t.id, req.Msg.Path, req.Msg.Recursive)
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: wid}), nil
}

// GetWatcherEvents takes a watcher's events since the last call. Once
// the watcher ended (an overflow: ResourceExhausted; its directory
// removed: NotFound) and its events were taken, the call answers that
// error and the watcher is gone.
func (f *filesystemServer) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	evs, err := f.s.svc.WatcherEvents(ctx, t.c, t.id, req.Msg.WatcherId)
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	res := &filesystem.GetWatcherEventsResponse{Events: make([]*filesystem.FilesystemEvent, 0, len(evs))}
	for _, e := range evs {
		res.Events = append(res.Events, fsEvent(e))
	}
	return connect.NewResponse(res), nil
}

// RemoveWatcher stops a watcher: NotFound if there is none.
func (f *filesystemServer) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	t, err := f.s.target(ctx, req.Header())
	if err != nil {
		return nil, f.s.connectErr(err)
	}
	if err := f.s.svc.RemoveWatcher(ctx, t.c, t.id, req.Msg.WatcherId); err != nil {
		return nil, f.s.connectErr(err)
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
