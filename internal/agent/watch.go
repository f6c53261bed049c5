package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// Watching a directory (agentwire.OpWatch) with inotify, inside the
// sandbox: the directory is opened as the agent's other file ops open a
// path (through Options.Files when set: resolved inside the sandbox's
// root, kernel filesystems refused), and each directory under it is
// opened relative to it with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_XDEV): a recursive watch never follows a symlink and never
// leaves the watched directory's filesystem (as find -xdev), so a
// symlink to /proc or to any path outside is an entry like any other,
// never watched. The kernel is given the opened directory itself
// (/proc/self/fd/N), not a path it would resolve again.

// The watches' defaults (see watchLimits).
const (
	// DefaultMaxWatches is the most watches a sandbox's agent holds at
	// once: each is an inotify instance, of which the kernel allows a
	// user 128 by default, shared with the sandbox's own processes.
	DefaultMaxWatches = 32
	// DefaultMaxWatchDirs is the most directories one watch watches;
	// DefaultMaxSandboxWatchDirs the most a sandbox's watches do
	// together (inotify watches: the kernel's limit is per user and
	// shared with the sandbox's processes too).
	DefaultMaxWatchDirs        = 4096
	DefaultMaxSandboxWatchDirs = 16384
	// DefaultMaxWatchQueue is the most events a watch holds for a
	// gateway that takes them slower than they come: past it the watch
	// ends with an overflow (too_many), as inotify's own queue does.
	DefaultMaxWatchQueue = 4096
	// DefaultWatcherIdle is how long a watcher (agentwire's
	// OpWatcherCreate) lives without being read: its client went away.
	DefaultWatcherIdle = 10 * time.Minute
)

// watchLimits counts a server's watches and the directories they watch,
// against its caps (the defaults above; tests lower them).
type watchLimits struct {
	maxWatches, maxDirs, maxEach, maxQueue int
	idle                                   time.Duration // a watcher's (see DefaultWatcherIdle)

	mu        sync.Mutex // guards watches, dirs, overflows and watchers
	watches   int
	dirs      int
	overflows int               // watches ended by their queue's bound
	watchers  map[string]*watch // by id (watchers.go)
}

func defaultWatchLimits() watchLimits {
	return watchLimits{maxWatches: DefaultMaxWatches, maxDirs: DefaultMaxSandboxWatchDirs,
		maxEach: DefaultMaxWatchDirs, maxQueue: DefaultMaxWatchQueue, idle: DefaultWatcherIdle,
		watchers: map[string]*watch{}}
}

// takeWatch counts one more watch, or refuses it at the cap.
func (l *watchLimits) takeWatch() error {
	return l.take(&l.watches, l.maxWatches, "the sandbox has %d directory watches already (its cap): stop one first")
}

// takeDir counts one more watched directory, or refuses it at the cap.
func (l *watchLimits) takeDir() error {
	return l.take(&l.dirs, l.maxDirs, "the sandbox's watches watch %d directories already (its cap)")
}

// take adds one to *n (a field l.mu guards) unless it is at limit: then
// ErrTooMany, refused's format given *n.
func (l *watchLimits) take(n *int, limit int, refused string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if *n >= limit {
		return providers.Errorf(providers.ErrTooMany, refused, *n)
	}
	*n++
	return nil
}

func (l *watchLimits) release(watches, dirs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watches -= watches
	l.dirs -= dirs
}

// watch is one watch: an inotify instance and the directories it
// watches. The handler's goroutine sets it up; then only its reader
// goroutine touches fd's watches and dirs, and queue and end pass to the
// sender under mu.
type watch struct {
	s         *Server
	path      string   // the watched directory, as asked
	recursive bool     //
	dev, ino  uint64   // the watched directory's (it is opened anew: is it still the one?)
	fd        int      // the inotify instance; closed after the reader ended
	f         *os.File // fd, for reads the poller can stop (SetReadDeadline)

	dirs   map[int32]string // watch descriptor -> directory, relative to root ("" is root)
	rootWD int32
	// moved is a watched directory seen moving away (IN_MOVED_FROM)
	// whose arrival has not been seen yet: the kernel reports a rename's
	// IN_MOVED_TO right after, else it left the tree.
	moved *movedDir

	mu    sync.Mutex // guards queue and end
	queue []agentwire.WatchEvent
	end   *agentwire.WatchEnd
	wake  chan struct{} // a token when queue or end changed

	// A watcher's (watchers.go): its reader's end, and its idle timer.
	readDone chan struct{}
	idle     *time.Timer
}

// watchDir serves OpWatch on st: a reply, then event frames until the
// gateway closes the stream or the watch ends (an end frame says why).
// It returns once the watch's goroutines ended and its inotify instance
// is closed.
func (s *Server) watchDir(st io.ReadWriteCloser, req agentwire.Request) {
	if req.Watch == nil {
		agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "fs.watch without a path")))
		return
	}
	w, err := s.newWatch(*req.Watch)
	if err != nil {
		agentwire.WriteMsg(st, agentwire.ErrorReply(err))
		return
	}
	defer w.close()
	if agentwire.WriteMsg(st, agentwire.Reply{}) != nil {
		return
	}
	gone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// The gateway sends nothing more: its end closing (or the
		// connection breaking) ends the watch. Closing st here also
		// wakes a write blocked on a gateway that stopped reading.
		io.Copy(io.Discard, st)
		close(gone)
		st.Close()
	})
	wg.Go(w.read)
	w.send(st, gone)
	st.Close()
	w.f.SetReadDeadline(time.Now()) // ends read
	wg.Wait()
}

// newWatch opens the directory req names, starts an inotify instance and
// watches the directory (and, recursive, every directory under it).
// Errors: ErrNotFound, ErrInvalid (not a directory, not absolute, escapes
// the sandbox), ErrTooMany (a cap, or the kernel's inotify limits).
func (s *Server) newWatch(req agentwire.WatchRequest) (*watch, error) {
	if err := s.wl.takeWatch(); err != nil {
		return nil, err
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		s.wl.release(1, 0)
		if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOMEM) {
			return nil, providers.Errorf(providers.ErrTooMany, "the kernel's limit on inotify instances (per user, shared with the sandbox's processes) is reached")
		}
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &watch{s: s, path: req.Path, recursive: req.Recursive, fd: fd,
		f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]string{}, rootWD: -1, wake: make(chan struct{}, 1)}
	if _, err := w.addTree(""); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// close closes the inotify instance (which drops its watches) and gives
// the watch's counts back. The reader has ended.
func (w *watch) close() {
	w.f.Close()
	w.s.wl.release(1, len(w.dirs))
}

// push queues ev for the sender; it reports whether the watch ended
// (the queue was full: an overflow).
func (w *watch) push(ev agentwire.WatchEvent) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.end != nil {
		return true
	}
	if len(w.queue) >= w.s.wl.maxQueue {
		w.s.wl.overflowed()
		w.endLocked(providers.Errorf(providers.ErrTooMany, "more than %d events for %s were waiting for the client: events were lost", w.s.wl.maxQueue, w.path))
		return true
	}
	w.queue = append(w.queue, ev)
	w.signal()
	return false
}

// finish ends the watch with err (the first end wins).
func (w *watch) finish(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.endLocked(err)
}

func (w *watch) endLocked(err error) {
	if w.end == nil {
		rep := agentwire.ErrorReply(err)
		w.end = &agentwire.WatchEnd{Error: rep.Error, Kind: rep.Kind}
		w.signal()
	}
}

func (w *watch) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// send writes the queued events to st as they come, then the end frame
// once the watch ended; it returns then, when gone is closed, or when a
// write fails.
func (w *watch) send(st io.Writer, gone <-chan struct{}) {
	for {
		select {
		case <-gone:
			return
		case <-w.wake:
		}
		w.mu.Lock()
		evs, end := w.queue, w.end
		w.queue = nil
		w.mu.Unlock()
		for len(evs) > 0 {
			n := min(fitEvents(evs, agentwire.MaxFrame), agentwire.MaxWatchBatch)
			b, _ := json.Marshal(evs[:n])
			if agentwire.WriteFrame(st, agentwire.FrameEvents, b) != nil {
				return
			}
			evs = evs[n:]
		}
		if end != nil {
			b, _ := json.Marshal(end)
			agentwire.WriteFrame(st, agentwire.FrameWatchEnd, b)
			return
		}
	}
}

// overflowed counts a watch ended by its queue's bound.
func (l *watchLimits) overflowed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.overflows++
}

// counts is the watches and directories held (tests).
func (l *watchLimits) counts() [2]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return [2]int{l.watches, l.dirs}
}

// fitEvents is how many of evs (at least one) surely fit a message of
// limit bytes as JSON: each name counted as if every byte were escaped
// (\u00XX), the rest of an event's JSON under 32 bytes.
func fitEvents(evs []agentwire.WatchEvent, limit int) int {
	n, size := 0, 0
	for n < len(evs) {
		size += 6*len(evs[n].Name) + 32
		if n > 0 && size > limit-64 {
			break
		}
		n++
	}
	return n
}
