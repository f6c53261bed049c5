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
