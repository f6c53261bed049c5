package sandbox

import (
	"context"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/wire"
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
		return s.watchFailed(ctx, b, err)
	}
	return err
}

// CreateWatcher starts a watcher of the directory p of sandbox id (see
// WatchDir): the sandbox's agent holds it and queues its events until
// WatcherEvents takes them, across gateway restarts, until RemoveWatcher,
// or until it is not read for the agent's idle bound (ten minutes). It
// returns the watcher's id. Errors as WatchDir's before it starts.
func (s *Service) CreateWatcher(ctx context.Context, c Caller, id, p string, recursive bool) (string, error) {
	if err := checkPath(p); err != nil {
		return "", providers.InvalidFields{{Field: "path", Message: err.Error()}}
	}
	ag, b, end, err := s.agentHost(ctx, c, id, "directory watches", nil)
	if err != nil {
		return "", err
	}
	defer end()
	wid, err := ag.CreateWatcher(ctx, agentclient.WatchRequest{Path: resolve(b.rec.Workdir, p), Recursive: recursive})
	if err != nil {
		return "", s.watchFailed(ctx, b, err)
	}
	return wid, nil
}

// WatcherEvents takes the events watcher wid of sandbox id queued, oldest
// first (none: nothing happened since). Once the watcher ended and all
// was taken it returns the end (as WatchDir's) and the watcher is gone;
// ErrNotFound for an unknown watcher.
func (s *Service) WatcherEvents(ctx context.Context, c Caller, id, wid string) ([]WatchEvent, error) {
	ag, b, end, err := s.watcherHost(ctx, c, id, wid)
	if err != nil {
		return nil, err
	}
	defer end()
	evs, err := ag.WatcherEvents(ctx, wid)
	if err != nil {
		return nil, s.watchFailed(ctx, b, err)
	}
	return evs, nil
}

// RemoveWatcher stops watcher wid of sandbox id: ErrNotFound if unknown.
func (s *Service) RemoveWatcher(ctx context.Context, c Caller, id, wid string) error {
	ag, b, end, err := s.watcherHost(ctx, c, id, wid)
	if err != nil {
		return err
	}
	defer end()
	if err := ag.RemoveWatcher(ctx, wid); err != nil {
		return s.watchFailed(ctx, b, err)
	}
	return nil
}

func (s *Service) watcherHost(ctx context.Context, c Caller, id, wid string) (*agentclient.Client, *box, func(), error) {
	return s.agentHost(ctx, c, id, "directory watches", func() error {
		if !agentclient.ValidWatcherID(wid) {
			return providers.Errorf(providers.ErrNotFound, "sandbox %s has no watcher %q", id, wire.Truncate(wid, 40))
		}
		return nil
	})
}

// watchFailed is err, from sandbox b's agent about a watch, as the client
// gets it: the agent's refusals and a watch's end pass through as they
// are; anything else as commandFailed says.
func (s *Service) watchFailed(ctx context.Context, b *box, err error) error {
	switch providers.Kind(err) {
	case providers.ErrNotFound, providers.ErrInvalid, providers.ErrTooMany, providers.ErrForbidden:
		return err
	}
	return s.commandFailed(ctx, b, err)
}
