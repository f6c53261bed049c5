package agent

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
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

func (l *watchLimits) takeWatch() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watches >= l.maxWatches {
		return providers.Errorf(providers.ErrTooMany, "the sandbox has %d directory watches already (its cap): stop one first", l.watches)
	}
	l.watches++
	return nil
}

func (l *watchLimits) takeDir() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dirs >= l.maxDirs {
		return providers.Errorf(providers.ErrTooMany, "the sandbox's watches watch %d directories already (its cap)", l.dirs)
	}
	l.dirs++
	return nil
}

func (l *watchLimits) release(watches, dirs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watches -= watches
	l.dirs -= dirs
}

// watchMask is what a watched directory reports. IN_EXCL_UNLINK: nothing
// about a file after it was unlinked; IN_ONLYDIR: a directory or
// nothing.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

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

// openDir opens the directory at p for reading, as the other file ops
// resolve a path.
func (s *Server) openDir(p string) (f *os.File, err error) {
	if s.opts.Files != nil {
		s.opts.ForkOn(func() { f, err = s.opts.Files.Dir(p) })
		return f, err
	}
	if !filepath.IsAbs(p) {
		return nil, providers.Errorf(providers.ErrInvalid, "path %q is not absolute", p)
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, fileError(p, err)
	}
	if !st.IsDir() {
		return nil, providers.Errorf(providers.ErrInvalid, "%s is not a directory", p)
	}
	f, err = os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fileError(p, err)
	}
	return f, nil
}

// addTree watches the directory rel (relative to the root; "" the root)
// and, for a recursive watch, every directory under it, on the fork
// thread as the other file ops run. The root is opened anew each time
// (as any path is) and closed after: a descriptor held open would keep
// its removal from being reported (IN_DELETE_SELF comes when the last
// reference goes). A directory that vanished meanwhile,
// is a symlink, lies on another filesystem or cannot be read is skipped
// (the root is an error); a cap reached is an error. It returns the
// paths it found under rel (recursive only): what appeared in a new
// directory before its watch was in place, which inotify cannot report.
func (w *watch) addTree(rel string) (found []string, err error) {
	root, err := w.s.openDir(w.path)
	if err != nil {
		if rel != "" {
			return nil, nil // the root went meanwhile: its own event ends the watch
		}
		return nil, err
	}
	defer root.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(root.Fd()), &st); err != nil {
		return nil, fileError(w.path, err)
	}
	if rel == "" {
		w.dev, w.ino = st.Dev, st.Ino
	} else if st.Dev != w.dev || st.Ino != w.ino {
		return nil, nil // another directory took the root's place: the root's own event ends the watch
	}
	w.s.opts.ForkOn(func() { found, err = w.addTreeHere(int(root.Fd()), rel) })
	return found, err
}

func (w *watch) addTreeHere(rootFD int, rel string) ([]string, error) {
	var found []string
	todo := []string{rel}
	for len(todo) > 0 {
		d := todo[0]
		todo = todo[1:]
		name := d
		if name == "" {
			name = "."
		}
		fd, err := unix.Openat2(rootFD, name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			if d == "" {
				return nil, fileError(w.path, err)
			}
			continue
		}
		f := os.NewFile(uintptr(fd), "/proc/self/fd/"+strconv.Itoa(fd))
		err = w.add(fd, d)
		var entries []os.DirEntry
		if err == nil && w.recursive {
			entries, _ = f.ReadDir(-1)
		}
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			p := path.Join(d, e.Name())
			found = append(found, p)
			if e.IsDir() {
				todo = append(todo, p)
			}
		}
	}
	return found, nil
}

// add watches the directory open as fd, rel to the root.
func (w *watch) add(fd int, rel string) error {
	if len(w.dirs) >= w.s.wl.maxEach {
		return providers.Errorf(providers.ErrTooMany, "watching %s takes more than %d directories (the cap of one watch): watch a smaller tree", w.path, w.s.wl.maxEach)
	}
	if err := w.s.wl.takeDir(); err != nil {
		return err
	}
	wd, err := unix.InotifyAddWatch(w.fd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if err != nil {
		w.s.wl.release(0, 1)
		switch {
		case errors.Is(err, unix.ENOSPC):
			return providers.Errorf(providers.ErrTooMany, "the kernel's limit on inotify watches (per user, shared with the sandbox's processes) is reached")
		case rel == "":
			return fileError(w.path, err)
		}
		return nil // gone meanwhile, or not readable: not watched
	}
	if _, ok := w.dirs[int32(wd)]; ok {
		w.s.wl.release(0, 1) // already watched (the kernel answers the same descriptor)
		return nil
	}
	w.dirs[int32(wd)] = rel
	if rel == "" {
		w.rootWD = int32(wd)
	}
	return nil
}

// read reads the inotify instance until its read deadline passes (the
// watch is over) or the watch ends.
func (w *watch) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) {
				w.finish(fmt.Errorf("read inotify: %w", err))
			}
			return
		}
		if w.handle(buf[:n]) {
			return
		}
	}
}

// inotifyHeader is the size of struct inotify_event before its name.
const inotifyHeader = unix.SizeofInotifyEvent

type movedDir struct {
	cookie uint32
	rel    string
}

// handle queues the events in buf (whole inotify events) and watches the
// directories that appeared; it reports whether the watch ended.
func (w *watch) handle(buf []byte) bool {
	for off := 0; off+inotifyHeader <= len(buf); {
		wd := int32(binary.NativeEndian.Uint32(buf[off:]))
		mask := binary.NativeEndian.Uint32(buf[off+4:])
		cookie := binary.NativeEndian.Uint32(buf[off+8:])
		n := int(binary.NativeEndian.Uint32(buf[off+12:]))
		name := strings.TrimRight(string(buf[off+inotifyHeader:min(off+inotifyHeader+n, len(buf))]), "\x00")
		off += inotifyHeader + n
		if m := w.moved; m != nil && (mask&unix.IN_MOVED_TO == 0 || cookie != m.cookie) {
			w.dropDirs(m.rel) // moved out of the watched tree
			w.moved = nil
		}

		if mask&unix.IN_Q_OVERFLOW != 0 {
			w.finish(providers.Errorf(providers.ErrTooMany, "the kernel's queue of events for %s overflowed: events were lost", w.path))
			return true
		}
		dir, ok := w.dirs[wd]
		if mask&unix.IN_IGNORED != 0 {
			if ok {
				delete(w.dirs, wd)
				w.s.wl.release(0, 1)
			}
			if wd == w.rootWD {
				w.finish(providers.Errorf(providers.ErrNotFound, "%s was removed", w.path))
				return true
			}
			continue
		}
		if !ok {
			continue // a directory no longer watched
		}
		if mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
			if wd == w.rootWD {
				w.finish(providers.Errorf(providers.ErrNotFound, "%s was removed or moved", w.path))
				return true
			}
			continue // its parent reports it
		}
		op := opOf(mask)
		if op == "" || name == "" {
			continue
		}
		rel := path.Join(dir, name)
		// A directory that appeared is watched before its event is
		// queued: a client that saw the event sees what happens in it.
		var found []string
		var err error
		if w.recursive && mask&unix.IN_ISDIR != 0 {
			switch {
			case mask&unix.IN_MOVED_FROM != 0:
				w.moved = &movedDir{cookie: cookie, rel: rel}
			case mask&unix.IN_MOVED_TO != 0:
				if m := w.moved; m != nil {
					w.renameDirs(m.rel, rel)
					w.moved = nil
				} else {
					found, err = w.addTree(rel) // moved in from outside
				}
			case mask&unix.IN_CREATE != 0:
				found, err = w.addTree(rel)
			}
		}
		if w.push(agentwire.WatchEvent{Name: rel, Op: op}) {
			return true
		}
		for _, p := range found {
			if w.push(agentwire.WatchEvent{Name: p, Op: agentwire.WatchCreate}) {
				return true
			}
		}
		if err != nil {
			w.finish(err)
			return true
		}
	}
	return false
}

// opOf is the operation of an inotify event's mask, or "".
func opOf(mask uint32) string {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return agentwire.WatchCreate
	case mask&unix.IN_MODIFY != 0:
		return agentwire.WatchWrite
	case mask&unix.IN_DELETE != 0:
		return agentwire.WatchRemove
	case mask&unix.IN_MOVED_FROM != 0:
		return agentwire.WatchRename
	case mask&unix.IN_ATTRIB != 0:
		return agentwire.WatchChmod
	}
	return ""
}

// under reports whether d is dir or under it.
func under(d, dir string) bool {
	return d == dir || strings.HasPrefix(d, dir+"/")
}

// renameDirs renames the watched directories under old (moved within the
// tree) to be under new.
func (w *watch) renameDirs(old, new string) {
	for wd, d := range w.dirs {
		if under(d, old) {
			w.dirs[wd] = new + d[len(old):]
		}
	}
}

// dropDirs stops watching the directories under old (moved out of the
// tree): their names would be wrong.
func (w *watch) dropDirs(old string) {
	for wd, d := range w.dirs {
		if under(d, old) {
			unix.InotifyRmWatch(w.fd, uint32(wd))
			delete(w.dirs, wd)
			w.s.wl.release(0, 1)
		}
	}
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

// counts is the watches and directories held (tests).
func (l *watchLimits) overflowed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.overflows++
}

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
