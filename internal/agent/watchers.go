package agent

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// Watchers are watches the server holds between calls (agentwire's
// OpWatcherCreate): the reader queues their events, bounded as a
// stream's are, until a call takes them. A watcher ends when it is
// removed, when it ended (an overflow, a cap, its directory removed) and
// its queue was taken to its end, when it was not read for the idle
// bound, or when the server closes.

// createWatcher starts a watcher of req and returns its id.
func (s *Server) createWatcher(req agentwire.WatchRequest) (string, error) {
	w, err := s.newWatch(req)
	if err != nil {
		return "", err
	}
	b := make([]byte, agentwire.WatcherHex/2)
	rand.Read(b) // crypto/rand never fails on Linux
	id := agentwire.WatcherPrefix + hex.EncodeToString(b)
	w.readDone = make(chan struct{})
	s.wl.mu.Lock()
	s.wl.watchers[id] = w
	w.idle = time.AfterFunc(s.wl.idle, func() { s.removeWatcher(id) })
	s.wl.mu.Unlock()
	go func() {
		defer close(w.readDone)
		w.read()
	}()
	return id, nil
}

// removeWatcher stops watcher id and forgets it: ErrNotFound if there is
// none.
func (s *Server) removeWatcher(id string) error {
	s.wl.mu.Lock()
	w := s.wl.watchers[id]
	delete(s.wl.watchers, id)
	s.wl.mu.Unlock()
	if w == nil {
		return providers.Errorf(providers.ErrNotFound, "no watcher %q", id)
	}
	w.idle.Stop()
	w.f.SetReadDeadline(time.Now())
	<-w.readDone
	w.close()
	return nil
}

// watcherEvents takes watcher id's queued events, oldest first, as many
// as a reply holds; once the watcher ended and all was taken, it answers
// the end instead and forgets the watcher.
func (s *Server) watcherEvents(id string) (agentwire.Reply, error) {
	s.wl.mu.Lock()
	w := s.wl.watchers[id]
	if w != nil {
		w.idle.Reset(s.wl.idle)
	}
	s.wl.mu.Unlock()
	if w == nil {
		return agentwire.Reply{}, providers.Errorf(providers.ErrNotFound, "no watcher %q", id)
	}
	w.mu.Lock()
	n := fitEvents(w.queue, agentwire.MaxReply)
	evs := w.queue[:n:n]
	w.queue = w.queue[n:]
	end := w.end
	w.mu.Unlock()
	if len(evs) > 0 || end == nil {
		return agentwire.Reply{Events: evs}, nil
	}
	s.removeWatcher(id)
	return agentwire.Reply{WatchEnd: end}, nil
}

// closeWatchers removes every watcher (Close).
func (s *Server) closeWatchers() {
	s.wl.mu.Lock()
	ids := make([]string, 0, len(s.wl.watchers))
	for id := range s.wl.watchers {
		ids = append(ids, id)
	}
	s.wl.mu.Unlock()
	for _, id := range ids {
		s.removeWatcher(id)
	}
}

// watcherOp serves the watcher ops.
func (s *Server) watcherOp(req agentwire.Request) agentwire.Reply {
	var rep agentwire.Reply
	var err error
	switch req.Op {
	case agentwire.OpWatcherCreate:
		if req.Watch == nil {
			err = providers.Errorf(providers.ErrInvalid, "%s without a path", req.Op)
			break
		}
		rep.Watcher, err = s.createWatcher(*req.Watch)
	case agentwire.OpWatcherEvents:
		rep, err = s.watcherEvents(req.ID)
	case agentwire.OpWatcherRemove:
		err = s.removeWatcher(req.ID)
	}
	if err != nil {
		return agentwire.ErrorReply(err)
	}
	return rep
}
