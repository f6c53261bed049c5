package local

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// Files are opened inside the sandbox by its agent, as sandbox root on the
// forker thread (no CAP_SYS_ADMIN, the seccomp filter), and handed to the
// gateway, which only streams bytes through the descriptor; files/info
// and files/list are answered by the agent the same way (stat, list): the
// gateway never resolves a sandbox path with host credentials. Every path is
// resolved with openat2(RESOLVE_IN_ROOT): "..", absolute symlinks and
// symlinks with too many ".." all stay inside the sandbox, and magic links
// (/proc/<pid>/root and the like) are refused. Kernel interfaces (/proc,
// /sys, cgroup, debug and security filesystems) are refused by filesystem
// type, whatever path leads to them.
//
// With isolation "none" the gateway resolves paths itself against the
// sandbox's directory (<dir>/fs), the same way.

// not in x/sys/unix

// StatFile describes the file at p, as lstat does (a symlink's target as
// readlink gives it inside the sandbox). ErrNotFound if missing,
// ErrInvalid for a path that escapes or is on a kernel interface
// filesystem (/proc, /sys), ErrConflict unless the sandbox is running.
func (l *Local) StatFile(ctx context.Context, id, p string) (providers.FileInfo, error) {
	sb, err := l.running(id)
	if err != nil {
		return providers.FileInfo{}, err
	}
	if _, err := jail.RelPath(p); err != nil {
		return providers.FileInfo{}, err
	}
	var fi providers.FileInfo
	err = sb.call(ctx, func(c *agentclient.Client) (err error) {
		fi, err = c.StatFile(ctx, p)
		return err
	})
	return fi, err
}

// ListDir lists the directory at p (see StatFile); ErrInvalid if p is
// not a directory.
func (l *Local) ListDir(ctx context.Context, id, p string) ([]providers.FileInfo, bool, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, false, err
	}
	if _, err := jail.RelPath(p); err != nil {
		return nil, false, err
	}
	var entries []providers.FileInfo
	var truncated bool
	err = sb.call(ctx, func(c *agentclient.Client) (err error) {
		entries, truncated, err = c.ListDir(ctx, p)
		return err
	})
	return entries, truncated, err
}

// WriteFile streams r into the file at p, creating parent directories
// (mode 0755) and the file (0644) as sandbox root, and truncating an
// existing file. ErrInvalid if p is a directory or not a regular file,
// ErrConflict if the sandbox is paused or stopped.
func (l *Local) WriteFile(ctx context.Context, id, p string, r io.Reader) (int64, error) {
	sb, err := l.running(id)
	if err != nil {
		return 0, err
	}
	rel, err := jail.RelPath(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, providers.Errorf(providers.ErrInvalid, "is a directory")
	}
	f, err := sb.open(ctx, p, true)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := io.CopyBuffer(f, agentclient.ContextReader{Ctx: ctx, R: r}, make([]byte, agentclient.CopyBuffer))
	if err != nil {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		var pe *os.PathError
		if errors.As(err, &pe) {
			return n, jail.FileErr(pe.Err)
		}
		return n, err // the reader's error
	}
	if err := f.Close(); err != nil {
		return n, jail.FileErr(err)
	}
	return n, nil
}

// open has the sandbox's agent open the file at p, for reading or
// writing, and pass it here.
func (sb *sandbox) open(ctx context.Context, p string, write bool) (f *os.File, err error) {
	err = sb.call(ctx, func(c *agentclient.Client) (err error) {
		f, err = c.Open(ctx, p, write)
		return err
	})
	return f, err
}

// ReadFile opens the regular file at p for streaming and returns it with
// its size; the caller closes it. ErrNotFound if missing, ErrInvalid for a
// directory or anything but a regular file, ErrConflict if the sandbox is
// paused or stopped.
func (l *Local) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, 0, err
	}
	if _, err := jail.RelPath(p); err != nil {
		return nil, 0, err
	}
	f, err := sb.open(ctx, p, false)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, jail.FileErr(err)
	}
	return f, fi.Size(), nil
}

var _ providers.FileLister = (*Local)(nil)
