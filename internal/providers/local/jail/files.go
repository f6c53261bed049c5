package jail

import (
	"errors"
	"os"
	"path"
	"strings"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
	"golang.org/x/sys/unix"
)

const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// RelPath checks an absolute sandbox path and returns it relative to the
// root ("." for the root itself). A ".." that would climb above the root is
// ErrInvalid rather than silently clamped.
func RelPath(p string) (string, error) {
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

// FileErr maps a file syscall error to a kind with a client-safe message.
func FileErr(err error) error {
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
		return providers.Wrap(providers.ErrTooLarge, err, "no space left in the sandbox (its disk limit is reached)")
	case errors.Is(err, errKernelFS):
		return providers.Wrap(providers.ErrInvalid, err, "refusing a kernel interface file (/proc, /sys and the like)")
	}
	return err
}

// errKernelFS is an open refused because the file lives on a kernel
// interface filesystem.
var errKernelFS = errors.New("kernel interface filesystem")

const configfsMagic = 0x62656570

// kernelFS are the filesystem types the file routes refuse: reading them
// tells about the host kernel, and writing them configures it.
var kernelFS = map[int64]bool{
	unix.PROC_SUPER_MAGIC: true, unix.SYSFS_MAGIC: true, unix.CGROUP_SUPER_MAGIC: true,
	unix.CGROUP2_SUPER_MAGIC: true, unix.DEBUGFS_MAGIC: true, unix.TRACEFS_MAGIC: true,
	unix.SECURITYFS_MAGIC: true, unix.BPF_FS_MAGIC: true, unix.DEVPTS_SUPER_MAGIC: true,
	configfsMagic: true, unix.EFIVARFS_MAGIC: true, unix.PSTOREFS_MAGIC: true,
	unix.SELINUX_MAGIC: true, unix.SMACK_MAGIC: true, unix.BINFMTFS_MAGIC: true,
	unix.NSFS_MAGIC: true,
}

// onKernelFS reports errKernelFS if fd is on a kernel interface filesystem.
func onKernelFS(fd int) error {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return err
	}
	if kernelFS[int64(sfs.Type)] {
		return errKernelFS
	}
	return nil
}

// openUnder opens rel, resolved inside root, for reading or writing
// (created 0644 with missing parents 0755, truncated): a regular file,
// not on a kernel interface filesystem. The parent directory is checked
// too, so that a write is refused before a kernel file is opened (and
// truncated).
func openUnder(root *os.File, rel string, write bool) (*os.File, error) {
	flags, mode := unix.O_RDONLY, uint32(0)
	if write {
		if err := mkdirParents(root, rel); err != nil {
			return nil, err
		}
		flags, mode = unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, 0o644
	}
	pfd, err := openIn(root, path.Dir(rel), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	err = onKernelFS(pfd)
	unix.Close(pfd)
	if err != nil {
		return nil, err
	}
	// O_NONBLOCK so that a FIFO fails (ENXIO) instead of blocking.
	fd, err := openIn(root, rel, flags|unix.O_NONBLOCK|unix.O_NOCTTY, mode)
	if err != nil {
		return nil, err
	}
	if err := onKernelFS(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := regular(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "sandbox-file"), nil
}

// statUnder describes rel (relative to root; "." is the root) as lstat
// does, resolved inside root: its directory is opened and the entry
// described relative to it. Refused (errKernelFS) on a kernel interface
// filesystem, as reads are: the directory's, or the entry's own (/proc
// itself, a mount point). With namespaces it runs in the agent (see
// statInSandbox), so that a link's target is what readlink gives inside.
func statUnder(root *os.File, rel string) (providers.FileInfo, error) {
	dir, name := path.Dir(rel), path.Base(rel)
	if rel == "." {
		name = ""
	}
	d, err := openIn(root, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return providers.FileInfo{}, err
	}
	defer unix.Close(d)
	if err := onKernelFS(d); err != nil {
		return providers.FileInfo{}, err
	}
	if name != "" {
		// O_NOFOLLOW: a final symlink is described, not followed.
		fd, err := openIn(root, rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
		if err != nil {
			return providers.FileInfo{}, err
		}
		err = onKernelFS(fd)
		unix.Close(fd)
		if err != nil {
			return providers.FileInfo{}, err
		}
	}
	fi, err := agent.StatAt(d, name)
	if err != nil {
		return providers.FileInfo{}, err
	}
	if name == "" {
		fi.Name = "/"
	}
	return fi, nil
}

// listUnder lists the directory rel, resolved inside root (see
// statUnder; sgagent.ReadDir bounds the listing).
func listUnder(root *os.File, rel string) ([]providers.FileInfo, bool, error) {
	fd, err := openIn(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, false, err
	}
	d := os.NewFile(uintptr(fd), "sandbox-dir")
	defer d.Close()
	if err := onKernelFS(fd); err != nil {
		return nil, false, err
	}
	return agent.ReadDir(d)
}

// dirUnder opens the directory rel, resolved inside root, for reading:
// not on a kernel interface filesystem.
func dirUnder(root *os.File, rel string) (*os.File, error) {
	fd, err := openIn(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	if err := onKernelFS(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "sandbox-dir"), nil
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
			return FileErr(err)
		}
		parent := "."
		if i > 1 {
			parent = strings.Join(parts[:i-1], "/")
		}
		pfd, err := openIn(root, parent, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return FileErr(err)
		}
		// mkdirat does not follow a final symlink, and the parent was
		// resolved inside root: the new directory is inside too.
		err = unix.Mkdirat(pfd, parts[i-1], 0o755)
		unix.Close(pfd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return FileErr(err)
		}
	}
	return nil
}

// regular returns ErrInvalid unless fd is a regular file, then makes it
// blocking again.
func regular(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileErr(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return providers.Errorf(providers.ErrInvalid, "is a directory")
	default:
		return providers.Errorf(providers.ErrInvalid, "not a regular file")
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return FileErr(err)
	}
	return nil
}
