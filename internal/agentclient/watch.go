package agentclient

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
)

// WatchEvent is one change under a watched directory.
type WatchEvent = agentwire.WatchEvent

// WatchRequest is what Watch watches.
type WatchRequest = agentwire.WatchRequest

// Watch watches the directory req.Path in the sandbox (recursive: and the
// directories under it, as they appear). It calls started once the watch
// is in place, then events with each batch of changes in the order they
// happened, and returns when ctx ends (ctx's error), when started or
// events fails (that error), or when the watch ends: the agent's reason
// with its kind, ErrTooMany for an overflow (events were lost) or a cap
// on watched directories, ErrNotFound when the directory was removed.
// Errors before started: ErrNotFound, ErrInvalid (not a directory, not
// absolute, escapes the sandbox), ErrTooMany (a cap). An event named
// absolute or with "..", or of an unknown kind, is a lie.
func (c *Client) Watch(ctx context.Context, req WatchRequest, started func() error, events func([]WatchEvent) error) error {
	_, st, err := c.call(ctx, agentwire.Request{Op: agentwire.OpWatch, Watch: &req})
	if err != nil {
		return err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	if err := started(); err != nil {
		return err
	}
	var buf []byte
	for {
		typ, p, err := agentwire.ReadFrame(st, buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return c.fail(fmt.Errorf("watch %s: %w", req.Path, err))
		}
		buf = p[:0]
		switch typ {
		case agentwire.FrameEvents:
			var evs []WatchEvent
			if err := json.Unmarshal(p, &evs); err != nil || len(evs) == 0 || len(evs) > agentwire.MaxWatchBatch {
				return c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("watch %s: an events frame that is not 1 to %d events", req.Path, agentwire.MaxWatchBatch)})
			}
			for _, ev := range evs {
				if err := checkEvent(ev); err != nil {
					return c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("watch %s: %v", req.Path, err)})
				}
			}
			if err := events(evs); err != nil {
				return err
			}
		case agentwire.FrameWatchEnd:
			var end agentwire.WatchEnd
			if err := json.Unmarshal(p, &end); err != nil || end.Error == "" {
				return c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("watch %s: an end frame without a reason", req.Path)})
			}
			return agentwire.RemoteError(end.Error, end.Kind)
		default:
			return c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("frame %q on a watch", typ)})
		}
	}
}

// checkEvent refuses an event no agent sends: a name that is empty,
// absolute, not clean or climbing out, or an unknown operation.
func checkEvent(ev WatchEvent) error {
	switch ev.Op {
	case agentwire.WatchCreate, agentwire.WatchWrite, agentwire.WatchRemove, agentwire.WatchRename, agentwire.WatchChmod:
	default:
		return fmt.Errorf("an event of unknown kind %q", ev.Op)
	}
	if ev.Name == "" || strings.HasPrefix(ev.Name, "/") || path.Clean(ev.Name) != ev.Name ||
		ev.Name == ".." || strings.HasPrefix(ev.Name, "../") || strings.ContainsRune(ev.Name, 0) {
		return fmt.Errorf("an event named %q, not a path under the directory", ev.Name)
	}
	return nil
}

// CreateWatcher starts a watcher of req (see agentwire.OpWatcherCreate),
// which the agent holds until it is removed, and returns its id. Errors
// as Watch's before it starts.
func (c *Client) CreateWatcher(ctx context.Context, req WatchRequest) (string, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpWatcherCreate, Watch: &req})
	if err != nil {
		return "", err
	}
	if !ValidWatcherID(rep.Watcher) {
		return "", c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("a watcher id %q", rep.Watcher)})
	}
	return rep.Watcher, nil
}

// WatcherEvents takes watcher id's queued events, oldest first (none:
// nothing happened since). Once the watcher ended and everything was
// taken, it returns its end as Watch does (ErrTooMany, ErrNotFound) and
// the watcher is gone; ErrNotFound too for a watcher the agent does not
// hold.
func (c *Client) WatcherEvents(ctx context.Context, id string) ([]WatchEvent, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpWatcherEvents, ID: id})
	if err != nil {
		return nil, err
	}
	if rep.WatchEnd != nil {
		if rep.WatchEnd.Error == "" || len(rep.Events) > 0 {
			return nil, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("watcher %s: an end without a reason, or with events", id)})
		}
		return nil, agentwire.RemoteError(rep.WatchEnd.Error, rep.WatchEnd.Kind)
	}
	for _, ev := range rep.Events {
		if err := checkEvent(ev); err != nil {
			return nil, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("watcher %s: %v", id, err)})
		}
	}
	return rep.Events, nil
}

// RemoveWatcher stops watcher id: ErrNotFound if the agent holds none.
func (c *Client) RemoveWatcher(ctx context.Context, id string) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpWatcherRemove, ID: id})
	return err
}

// ValidWatcherID reports whether id is shaped as the agent makes them.
func ValidWatcherID(id string) bool {
	return ValidID(id, agentwire.WatcherPrefix, agentwire.WatcherHex)
}

// ValidID reports whether id is prefix and n lowercase hex characters:
// the shape of the ids the gateway and the agent make.
func ValidID(id, prefix string, n int) bool {
	h, ok := strings.CutPrefix(id, prefix)
	if !ok || len(h) != n {
		return false
	}
	for _, r := range h {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return false
		}
	}
	return true
}
