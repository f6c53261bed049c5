package local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers/local/jail"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// Pause freezes every process of the sandbox: with the freezer cgroup when
// there is one, else by SIGSTOP to all of them (isolation "namespaces"
// only; ErrUnsupported otherwise). ErrConflict unless it is running.
func (l *Local) Pause(ctx context.Context, id string) error {
	return l.setPaused(ctx, id, true)
}

// Resume undoes Pause. ErrConflict unless the sandbox is paused.
func (l *Local) Resume(ctx context.Context, id string) error {
	return l.setPaused(ctx, id, false)
}

func (l *Local) setPaused(ctx context.Context, id string, pause bool) error {
	sb, err := l.lookup(id)
	if err != nil {
		return err
	}
	sb.dropHost()
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.deleted {
		return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	from, verb := providers.StateRunning, "pause"
	if !pause {
		from, verb = providers.StatePaused, "resume"
	}
	if s := sb.state(); s != from {
		return providers.Errorf(providers.ErrConflict, "cannot %s sandbox %s: it is %s", verb, id, s)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if fz := sb.st.Cgroups["freezer"]; fz != "" {
		want := "THAWED"
		if pause {
			want = "FROZEN"
		}
		if err := freeze(ctx, fz, want); err != nil {
			if pause {
				freeze(context.WithoutCancel(ctx), fz, "THAWED")
			}
			return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
		}
		return nil
	}
	if sb.st.Isolation != IsolationNamespaces {
		return providers.Errorf(providers.ErrUnsupported, "pause needs the freezer cgroup or isolation %q", IsolationNamespaces)
	}
	sig := syscall.SIGCONT
	if pause {
		sig = syscall.SIGSTOP
		// Mark first: an exec racing with the stop sees "paused" rather
		// than joining a half-stopped sandbox.
		if err := os.WriteFile(sb.dir+"/"+pausedFile, nil, 0o600); err != nil {
			return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
		}
	}
	if err := sb.call(ctx, func(c *agentclient.Client) error { return c.SignalAll(ctx, sig) }); err != nil {
		return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
	}
	if !pause {
		os.Remove(sb.dir + "/" + pausedFile)
	}
	return nil
}

// Delete kills the sandbox's processes and removes its cgroups and
// directory. ErrNotFound if there is no such sandbox (also the second
// time).
func (l *Local) Delete(ctx context.Context, id string) error {
	sb, err := l.locked(id)
	if err != nil {
		return err
	}
	defer sb.mu.Unlock()
	// Renaming claims the directory: from here on nobody finds the
	// sandbox, and a crash halfway leaves a .trash entry New cleans up.
	trash := filepath.Join(l.boxesDir, ".trash-"+id+"-"+randHex())
	if err := os.Rename(sb.dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			l.forget(sb)
			return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
		}
		return fmt.Errorf("delete %s: %w", id, err)
	}
	l.forget(sb)
	l.detachEgress(id)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	if err := destroy(ctx, trash, sb.st); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	l.freeRange(sb.st.IDBase)
	if sb.st.DiskFS == jail.FSBtrfs || len(sb.st.Layers) > 0 {
		l.collectSandbox(id, sb.st.Layers)
	}
	return nil
}

// forget drops sb from the cache; sb.mu is held.
func (l *Local) forget(sb *sandbox) {
	sb.deleted = true
	sb.unwatch()
	l.mu.Lock()
	if l.boxes[sb.id] == sb {
		delete(l.boxes, sb.id)
	}
	l.mu.Unlock()
}

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// destroy kills what runs in the sandbox at dir (described by st, which may
// be partial) and removes its cgroups and dir.
func destroy(ctx context.Context, dir string, st persisted) error {
	var errs []error
	if st.Pid > 0 && (st.StartTime == 0 || alive(st.Pid, st.StartTime)) {
		if st.Isolation == IsolationNone {
			// No pid namespace takes the commands down with init.
			sb := &sandbox{dir: dir, st: st}
			kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			sb.call(kctx, func(c *agentclient.Client) error { return c.KillAll(kctx) })
			sb.dropHost()
			cancel()
		}
		if err := killInit(ctx, st); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroups(ctx, st.Cgroups); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killInit SIGKILLs init and waits (until ctx ends) for it to exit, which
// in a pid namespace takes every process of the sandbox with it.
func killInit(ctx context.Context, st persisted) error {
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd_open init: %w", err)
	}
	defer unix.Close(fd)
	// The pidfd pins the pid: if it is still our init now, it is the one
	// signalled below.
	if st.StartTime != 0 && !alive(st.Pid, st.StartTime) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill init: %w", err)
	}
	// A frozen task dies only once thawed.
	if fz := st.Cgroups["freezer"]; fz != "" {
		os.WriteFile(fz+"/freezer.state", []byte("THAWED"), 0)
	}
	for {
		ms := 100
		if dl, ok := ctx.Deadline(); ok {
			ms = min(ms, max(int(time.Until(dl)/time.Millisecond), 0))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for init: %w", err)
		}
		if ctx.Err() != nil {
			return errors.New("init did not exit")
		}
	}
}

// removeTrash finishes deletes that a previous process did not.
func (l *Local) removeTrash() {
	entries, _ := os.ReadDir(l.boxesDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".trash-") {
			continue
		}
		dir := filepath.Join(l.boxesDir, e.Name())
		st, _ := readState(dir)
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		if err := destroy(ctx, dir, st); err != nil {
			l.log.Warn("local: removing a half-deleted sandbox", "dir", dir, "err", err)
		} else {
			l.freeRange(st.IDBase)
		}
		cancel()
	}
}
