package agent

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// StatAt describes name in the directory dirfd without following a
// symlink: one fstatat (and readlinkat for a symlink), relative to the
// descriptor, so the caller never resolves a sandbox's path itself. An
// empty name describes dirfd.
func StatAt(dirfd int, name string) (providers.FileInfo, error) {
	var st unix.Stat_t
	var err error
	if name == "" {
		err = unix.Fstat(dirfd, &st)
	} else {
		err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return providers.FileInfo{}, err
	}
	fi := providers.FileInfo{
		Name:    name,
		Size:    st.Size,
		Mode:    fs.FileMode(st.Mode & 0o777),
		ModTime: time.Unix(st.Mtim.Unix()).UTC(),
	}
	if st.Mode&unix.S_ISUID != 0 {
		fi.Mode |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		fi.Mode |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		fi.Mode |= fs.ModeSticky
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = providers.FileRegular
	case unix.S_IFDIR:
		fi.Type = providers.FileDir
	case unix.S_IFLNK:
		fi.Type = providers.FileSymlink
		buf := make([]byte, unix.PathMax)
		if n, err := unix.Readlinkat(dirfd, name, buf); err == nil {
			fi.Target = string(buf[:n])
		}
	default:
		fi.Type = providers.FileOther
	}
	return fi, nil
}

// ReadDir describes the entries of the open directory dir (see StatAt),
// sorted by name, at most providers.MaxDirEntries (and fewer when their
// names are long: see maxListBytes); truncated says there were more. An entry that vanishes meanwhile is left out.
func ReadDir(dir *os.File) (entries []providers.FileInfo, truncated bool, err error) {
	var names []string
	for {
		batch, err := dir.Readdirnames(1024)
		names = append(names, batch...)
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return nil, false, err
		}
		if len(names) > 4*providers.MaxDirEntries {
			truncated = true
			break
		}
	}
	slices.Sort(names)
	if len(names) > providers.MaxDirEntries {
		names, truncated = names[:providers.MaxDirEntries], true
	}
	entries = make([]providers.FileInfo, 0, len(names))
	budget := maxListBytes
	for _, n := range names {
		fi, err := StatAt(int(dir.Fd()), n)
		if err != nil {
			continue
		}
		if budget -= len(fi.Name) + len(fi.Target) + 128; budget < 0 {
			return entries, true, nil
		}
		entries = append(entries, fi)
	}
	return entries, truncated, nil
}

// maxListBytes bounds a listing's size (its names and targets, plus a
// little per entry for the rest), so that it fits in one reply.
const maxListBytes = 768 << 10

// statPath describes the file at the absolute path p (a symlink is not
// followed).
func statPath(p string) (providers.FileInfo, error) {
	if !filepath.IsAbs(p) {
		return providers.FileInfo{}, providers.Errorf(providers.ErrInvalid, "path %q is not absolute", p)
	}
	p = filepath.Clean(p)
	dir, name := filepath.Dir(p), filepath.Base(p)
	if p == "/" {
		dir, name = "/", ""
	}
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return providers.FileInfo{}, fileError(p, err)
	}
	defer d.Close()
	fi, err := StatAt(int(d.Fd()), name)
	if err != nil {
		return providers.FileInfo{}, fileError(p, &fs.PathError{Op: "stat", Path: p, Err: err})
	}
	if name == "" {
		fi.Name = "/"
	}
	return fi, nil
}

// listPath lists the directory at the absolute path p.
func listPath(p string) ([]providers.FileInfo, bool, error) {
	if !filepath.IsAbs(p) {
		return nil, false, providers.Errorf(providers.ErrInvalid, "path %q is not absolute", p)
	}
	d, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOCTTY, 0)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) {
			return nil, false, providers.Errorf(providers.ErrInvalid, "%s is not a directory", p)
		}
		return nil, false, fileError(p, err)
	}
	defer d.Close()
	entries, truncated, err := ReadDir(d)
	if err != nil {
		return nil, false, fileError(p, err)
	}
	return entries, truncated, nil
}
