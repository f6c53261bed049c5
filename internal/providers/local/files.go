package local

import (
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// Files are read and written by the gateway itself, resolving every path
// with openat2(RESOLVE_IN_ROOT) against the sandbox's root (init's root as
// /proc/<pid>/root shows it, mounts included): "..", absolute symlinks and
// symlinks with too many ".." all stay inside the sandbox, and magic links
// (/proc/<pid>/root and the like) are refused. Nothing is ever resolved on
// the host.

const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// copyBuf is the streaming buffer size: large enough for throughput, small
// enough that a 1 GiB file passes through a 64 MiB GOMEMLIMIT.
const copyBuf = 256 << 10

// relPath checks an absolute sandbox path and returns it relative to the
// root ("." for the root itself). A ".." that would climb above the root is
// ErrInvalid rather than silently clamped.
func relPath(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", providers.Errorf(providers.ErrInvalid, "path must be absolute")
	}
	if strings.ContainsRune(p, 0) {
		return "", providers.Errorf(providers.ErrInvalid, "path contains a NUL byte")
	}
	depth := 0
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "", ".":
		case "..":
			if depth--; depth < 0 {
				return "", providers.Errorf(providers.ErrInvalid, "path escapes the sandbox")
			}
		default:
			depth++
		}
	}
	rel := strings.TrimPrefix(path.Clean(p), "/")
	if rel == "" {
		rel = "."
	}
	return rel, nil
}

func openIn(root *os.File, rel string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat2(int(root.Fd()), rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_CLOEXEC),
			Mode:    uint64(mode),
			Resolve: resolveFlags,
		})
		// EAGAIN: a rename elsewhere raced with the lookup; RESOLVE_IN_ROOT
		// asks to retry.
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		return fd, err
	}
}

// fileErr maps a file syscall error to a kind with a client-safe message.
func fileErr(err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return providers.Wrap(providers.ErrNotFound, err, "no such file")
	case errors.Is(err, unix.EISDIR):
		return providers.Wrap(providers.ErrInvalid, err, "is a directory")
	case errors.Is(err, unix.ENOTDIR):
		return providers.Wrap(providers.ErrInvalid, err, "a parent of the path is not a directory")
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return providers.Wrap(providers.ErrInvalid, err, "path escapes the sandbox or has too many symlinks")
	case errors.Is(err, unix.EROFS):
		return providers.Wrap(providers.ErrInvalid, err, "read-only file system")
	case errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENODEV):
		return providers.Wrap(providers.ErrInvalid, err, "not a regular file")
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return providers.Wrap(providers.ErrInvalid, err, "permission denied")
	case errors.Is(err, unix.ENAMETOOLONG):
		return providers.Wrap(providers.ErrInvalid, err, "path too long")
	case errors.Is(err, unix.ENOSPC), errors.Is(err, unix.EDQUOT):
		return providers.Wrap(providers.ErrTooLarge, err, "no space left in the sandbox")
	}
	return err
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
	rel, err := relPath(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, providers.Errorf(providers.ErrInvalid, "is a directory")
	}
	root, err := sb.openRoot()
	if err != nil {
		return 0, err
	}
	defer root.Close()
	if err := mkdirParents(root, rel); err != nil {
		return 0, err
	}
	// O_NONBLOCK so that a FIFO fails (ENXIO) instead of blocking.
	fd, err := openIn(root, rel, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NONBLOCK|unix.O_NOCTTY, 0o644)
	if err != nil {
		return 0, fileErr(err)
	}
	f := os.NewFile(uintptr(fd), "sandbox-file")
	defer f.Close()
	if err := regular(fd); err != nil {
		return 0, err
	}
	n, err := io.CopyBuffer(f, ctxReader{ctx, r}, make([]byte, copyBuf))
	if err != nil {
		if ctx.Err() != nil {
			return n, ctx.Err()
		}
		var pe *os.PathError
		if errors.As(err, &pe) {
			return n, fileErr(pe.Err)
		}
		return n, err // the reader's error
	}
	if err := f.Close(); err != nil {
		return n, fileErr(err)
	}
	return n, nil
}

// mkdirParents creates the missing parent directories of rel, each one
// resolved inside root.
func mkdirParents(root *os.File, rel string) error {
	parts := strings.Split(rel, "/")
	for i := 1; i < len(parts); i++ {
		dir := strings.Join(parts[:i], "/")
		fd, err := openIn(root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err == nil {
			unix.Close(fd)
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return fileErr(err)
		}
		parent := "."
		if i > 1 {
			parent = strings.Join(parts[:i-1], "/")
		}
		pfd, err := openIn(root, parent, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return fileErr(err)
		}
		// mkdirat does not follow a final symlink, and the parent was
		// resolved inside root: the new directory is inside too.
		err = unix.Mkdirat(pfd, parts[i-1], 0o755)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fileErr(err)
		}
	}
	return nil
}

// regular returns ErrInvalid unless fd is a regular file, then makes it
// blocking again.
func regular(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fileErr(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return providers.Errorf(providers.ErrInvalid, "is a directory")
	default:
		return providers.Errorf(providers.ErrInvalid, "not a regular file")
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return fileErr(err)
	}
	return nil
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
	rel, err := relPath(p)
	if err != nil {
		return nil, 0, err
	}
	root, err := sb.openRoot()
	if err != nil {
		return nil, 0, err
	}
	defer root.Close()
	fd, err := openIn(root, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, fileErr(err)
	}
	if err := regular(fd); err != nil {
		unix.Close(fd)
		return nil, 0, err
	}
	f := os.NewFile(uintptr(fd), "sandbox-file")
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fileErr(err)
	}
	return f, fi.Size(), nil
}
