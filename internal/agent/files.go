package agent

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// fileError maps an error of a file operation on path to its kind.
func fileError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return providers.Errorf(providers.ErrNotFound, "%s does not exist in the sandbox", path)
	case errors.Is(err, syscall.EISDIR):
		return providers.Errorf(providers.ErrInvalid, "%s is a directory", path)
	case errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.ENODEV):
		// A FIFO without a reader, opened not to wait for one; a device.
		return providers.Errorf(providers.ErrInvalid, "%s is not a regular file", path)
	case errors.Is(err, syscall.ENOTDIR):
		return providers.Errorf(providers.ErrInvalid, "a parent of %s is not a directory", path)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return providers.Errorf(providers.ErrForbidden, "%s: %v", path, errors.Unwrap(err))
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return providers.Errorf(providers.ErrTooLarge, "%s: the sandbox's disk is full", path)
	}
	return err
}

// openRead opens the regular file at path for reading. A FIFO or device
// is refused without blocking on it.
func openRead(path string) (*os.File, int64, error) {
	if !filepath.IsAbs(path) {
		return nil, 0, providers.Errorf(providers.ErrInvalid, "path %q is not absolute", path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, 0, fileError(path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fileError(path, err)
	}
	if st.IsDir() {
		f.Close()
		return nil, 0, providers.Errorf(providers.ErrInvalid, "%s is a directory", path)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, providers.Errorf(providers.ErrInvalid, "%s is not a regular file", path)
	}
	return f, st.Size(), nil
}

// writeTo replaces the file at path with r's bytes, creating parent
// directories, and returns the bytes written.
func writeTo(path string, r io.Reader) (int64, error) {
	f, err := openWrite(path)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, fileError(path, err)
	}
	return n, nil
}

// openWrite opens the regular file at path for writing, creating it and
// its parent directories, and truncating it.
func openWrite(path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, providers.Errorf(providers.ErrInvalid, "path %q is not absolute", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fileError(filepath.Dir(path), err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOCTTY|unix.O_NONBLOCK, 0o644)
	if err != nil {
		return nil, fileError(path, err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, providers.Errorf(providers.ErrInvalid, "%s is not a regular file", path)
	}
	return f, nil
}
