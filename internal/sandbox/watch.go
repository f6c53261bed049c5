package sandbox

import (
	"context"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// WatchEvent is one change under a watched directory: its path relative
// to the directory and what happened (see agentwire's Watch* operations).
type WatchEvent = agentclient.WatchEvent

// WatchDir watches the directory p of sandbox id (relative to its
// workdir; recursive: and the directories under it, as they appear)
// through the sandbox's agent, which watches inside the sandbox: started
// gets the directory's absolute path once the watch is in place, events
// each batch of changes in order. It returns when ctx ends, when started
// or events fails (that error, as it is), or when the watch ends:
// ErrTooMany for an overflow (events were lost) or a cap on watches,
// ErrNotFound when the directory was removed. Before started: ErrNotFound
// (no such directory), ErrInvalid (not a directory, escapes the sandbox),
// ErrTooMany, ErrUnsupported (a provider without an agent). The sandbox
// counts as busy (never idle) while it is watched.
func (s *Service) WatchDir(ctx context.Context, c Caller, id, p string, recursive bool,
	started func(abs string) error, events func([]WatchEvent) error) error {
	if err := checkPath(p); err != nil {
		return providers.InvalidFields{{Field: "path", Message: err.Error()}}
	}
	ag, b, end, err := s.agentHost(ctx, c, id, "directory watches", nil)
	if err != nil {
		return err
	}
	defer end()
	abs := resolve(b.rec.Workdir, p)
	var theirs bool // the error is started's or events'
	err = ag.Watch(ctx, agentclient.WatchRequest{Path: abs, Recursive: recursive}, func() error {
		err := started(abs)
		theirs = err != nil
		return err
	}, func(evs []WatchEvent) error {
		err := events(evs)
		theirs = err != nil
		return err
	})
	if err != nil && !theirs {
		switch providers.Kind(err) {
		case providers.ErrNotFound, providers.ErrInvalid, providers.ErrTooMany, providers.ErrForbidden:
			return fileErr("watch", p, err)
		}
		return s.commandFailed(ctx, b, err)
	}
	return err
}
