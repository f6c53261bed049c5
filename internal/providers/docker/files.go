package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/sandgate/sandgate/internal/providers"
)

// maxLinkHops bounds symlink resolution. The daemon resolves a link's
// target fully (inside the container's root) in one stat, so more than one
// hop only happens when a link changes under us.
const maxLinkHops = 8

// spoolThreshold is the largest stream of unknown length WriteFile keeps
// in memory; longer ones are spooled to Options.SpoolDir.
const spoolThreshold = 1 << 20

// requireRunning returns nil if the sandbox's container is running and
// not paused; ErrNotFound if there is none, ErrConflict otherwise.
func (d *Docker) requireRunning(ctx context.Context, id string) error {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return d.kind(err, "sandbox %s", id)
	}
	st, _ := stateOf(info.State)
	if st != providers.StateRunning {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, st)
	}
	return nil
}

// stat follows the final symlinks of p (inside the container's root) and
// returns the resolved path and its stat. ErrNotFound if the path or a
// link's target is missing.
func (d *Docker) stat(ctx context.Context, id, p string) (string, container.PathStat, error) {
	for range maxLinkHops {
		st, err := d.cli.ContainerStatPath(ctx, id, p)
		if err != nil {
			if cerrdefs.IsNotFound(err) {
				return p, st, providers.Wrap(providers.ErrNotFound, err, "no such file: "+p)
			}
			return p, st, d.kind(err, "stat %s", p)
		}
		if st.Mode&os.ModeSymlink == 0 {
			return p, st, nil
		}
		p = path.Clean("/" + st.LinkTarget)
	}
	return p, container.PathStat{}, providers.Errorf(providers.ErrInvalid, "too many levels of symbolic links: %s", p)
}

// ReadFile streams the regular file at p out of the container's archive
// endpoint. A final symlink is followed inside the sandbox. ErrNotFound if
// missing, ErrInvalid for a directory or another non-regular file,
// ErrConflict if the sandbox is paused or stopped. The caller closes the
// reader; it is bound to ctx.
func (d *Docker) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	if err := d.requireRunning(ctx, id); err != nil {
		return nil, 0, err
	}
	p, st, err := d.stat(ctx, id, path.Clean("/"+p))
	if err != nil {
		return nil, 0, err
	}
	if st.Mode.IsDir() {
		return nil, 0, providers.Errorf(providers.ErrInvalid, "%s is a directory", p)
	}
	if !st.Mode.IsRegular() {
		return nil, 0, providers.Errorf(providers.ErrInvalid, "%s is not a regular file", p)
	}
	rc, _, err := d.cli.CopyFromContainer(ctx, id, p)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, 0, providers.Wrap(providers.ErrNotFound, err, "no such file: "+p)
		}
		return nil, 0, d.kind(err, "read %s", p)
	}
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil {
		rc.Close()
		return nil, 0, providers.Wrap(providers.ErrUnavailable, err, "read "+p+": bad archive from the daemon")
	}
	if hdr.Typeflag != tar.TypeReg {
		// Replaced between the stat and the copy.
		rc.Close()
		return nil, 0, providers.Errorf(providers.ErrInvalid, "%s is not a regular file", p)
	}
	return &tarFile{Reader: io.LimitReader(tr, hdr.Size), body: rc}, hdr.Size, nil
}

// tarFile is the data of a tar's first entry; Close closes the response.
type tarFile struct {
	io.Reader
	body io.Closer
}

func (f *tarFile) Close() error { return f.body.Close() }

// WriteFile streams r into the file at p through the archive endpoint,
// following a final symlink inside the sandbox, creating missing parent
// directories (root-owned, by an exec of mkdir -p) and keeping an existing
// file's permissions (new files are 0644, owned by root). r is streamed
// when its length is known (Len or Seek) or it is under 1 MiB; otherwise
// it is spooled to a temporary file first, because a tar header carries
// the size. ErrInvalid if p is a directory or a parent is not one,
// ErrConflict if the sandbox is paused or stopped.
func (d *Docker) WriteFile(ctx context.Context, id, p string, r io.Reader) (int64, error) {
	if err := d.requireRunning(ctx, id); err != nil {
		return 0, err
	}
	p = path.Clean("/" + p)
	if p == "/" {
		return 0, providers.Errorf(providers.ErrInvalid, "/ is a directory")
	}
	mode := int64(0o644)
	dest, st, err := d.stat(ctx, id, p)
	switch {
	case err == nil && st.Mode.IsDir():
		return 0, providers.Errorf(providers.ErrInvalid, "%s is a directory", p)
	case err == nil && !st.Mode.IsRegular():
		return 0, providers.Errorf(providers.ErrInvalid, "%s is not a regular file", p)
	case err == nil:
		mode = int64(st.Mode.Perm())
	case providers.Kind(err) == providers.ErrNotFound:
		if err := d.ensureDir(ctx, id, path.Dir(dest)); err != nil {
			return 0, err
		}
	default:
		return 0, err
	}

	src, size, cleanup, err := d.sized(r)
	if err != nil {
		return 0, err
	}
	defer cleanup()

	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr = writeTar(pw, path.Base(dest), mode, size, src)
		pw.CloseWithError(werr)
	}()
	err = d.cli.CopyToContainer(ctx, id, path.Dir(dest), pr, container.CopyToContainerOptions{})
	// Unblock the writer if the daemon stopped reading early.
	pr.CloseWithError(errors.New("upload ended"))
	wg.Wait()
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return 0, providers.Wrap(providers.ErrNotFound, err, "write "+p+": parent directory vanished")
		}
		if cerrdefs.IsInvalidArgument(err) {
			return 0, providers.Wrap(providers.ErrInvalid, err, "cannot write "+p)
		}
		return 0, d.kind(err, "write %s", p)
	}
	if werr != nil {
		return 0, fmt.Errorf("write %s: reading the upload: %w", p, werr)
	}
	return size, nil
}

// writeTar writes a one-file tar of size bytes from src to w.
func writeTar(w io.Writer, name string, mode, size int64, src io.Reader) error {
	tw := tar.NewWriter(w)
	now := time.Now()
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: size,
		ModTime: now, AccessTime: now, ChangeTime: now, Format: tar.FormatPAX,
	}); err != nil {
		return err
	}
	n, err := io.CopyN(tw, src, size)
	if err != nil {
		return fmt.Errorf("after %d of %d bytes: %w", n, size, err)
	}
	return tw.Close()
}

// ensureDir makes dir (and its parents) if it does not exist.
func (d *Docker) ensureDir(ctx context.Context, id, dir string) error {
	_, st, err := d.stat(ctx, id, dir)
	switch {
	case err == nil && st.Mode.IsDir():
		return nil
	case err == nil:
		return providers.Errorf(providers.ErrInvalid, "%s is not a directory", dir)
	case providers.Kind(err) != providers.ErrNotFound:
		return err
	}
	out, code, err := d.run(ctx, id, execSpec{Cmd: []string{"mkdir", "-p", "--", dir}, WorkingDir: "/"})
	if err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if code != 0 {
		return providers.Wrap(providers.ErrInvalid, errors.New(string(out)), "cannot create directory "+dir)
	}
	return nil
}

// sized returns r with its length: directly when r knows it, else by
// reading up to spoolThreshold into memory, else by spooling it to a
// temporary file (removed by cleanup).
func (d *Docker) sized(r io.Reader) (io.Reader, int64, func(), error) {
	noop := func() {}
	switch v := r.(type) {
	case interface{ Len() int }:
		return r, int64(v.Len()), noop, nil
	case io.Seeker:
		if cur, err := v.Seek(0, io.SeekCurrent); err == nil {
			if end, err := v.Seek(0, io.SeekEnd); err == nil {
				if _, err := v.Seek(cur, io.SeekStart); err == nil {
					return r, end - cur, noop, nil
				}
			}
		}
	}
	var head bytes.Buffer
	if _, err := io.CopyN(&head, r, spoolThreshold+1); err == io.EOF {
		return bytes.NewReader(head.Bytes()), int64(head.Len()), noop, nil
	} else if err != nil {
		return nil, 0, noop, fmt.Errorf("reading the upload: %w", err)
	}
	f, err := os.CreateTemp(d.opts.SpoolDir, "sandgate-upload-*")
	if err != nil {
		return nil, 0, noop, fmt.Errorf("spooling the upload: %w", err)
	}
	cleanup := func() {
		f.Close()
		os.Remove(f.Name())
	}
	size, err := io.Copy(f, io.MultiReader(&head, r))
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		cleanup()
		return nil, 0, noop, fmt.Errorf("spooling the upload: %w", err)
	}
	return f, size, cleanup, nil
}
