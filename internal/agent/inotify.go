package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// A watch's inotify side: opening the watched tree, adding its
// directories, and reading the kernel's events into the watch's queue
// (watch.go).

// watchMask is what a watched directory reports. IN_EXCL_UNLINK: nothing
// about a file after it was unlinked; IN_ONLYDIR: a directory or
// nothing.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

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
// reference goes). A directory that vanished meanwhile, is a symlink,
// lies on another filesystem or cannot be read is skipped
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
		err = w.add(fd, d)
		var entries []os.DirEntry
		if err == nil && w.recursive {
			entries = listAfterWatch(fd)
		}
		unix.Close(fd)
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

// listAfterWatch lists the directory open as fd through a new opening of
// it, made after its watch. On a local sandbox's overlay root, a listing
// through the opening made before the watch missed a file created between
// that open and the watch, whose create came before the watch too: the
// file was neither listed nor reported, only its later writes.
func listAfterWatch(fd int) []os.DirEntry {
	dfd, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(dfd), "/proc/self/fd/"+strconv.Itoa(dfd))
	defer f.Close()
	entries, _ := f.ReadDir(-1)
	return entries
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
