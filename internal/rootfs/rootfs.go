// Package rootfs turns the image named at sandbox creation into a
// directory the local provider can use as the read-only lower layer of a
// sandbox's root overlay. An image is either
//
//   - an absolute path to a root filesystem directory, used in place; or
//   - an absolute path to an image tarball, `docker save` output or an OCI
//     image layout in a tar, optionally followed by a selector when it holds
//     several images: `/path/img.tar:repo:tag` or `/path/img.tar@sha256:…`.
//
// A tarball is unpacked once into a Store, a cache directory keyed by the
// image's config digest, with its layers flattened (whiteouts applied) and
// checked against the config's diff_ids, so the cache key names the content.
// Nothing is ever pulled from a registry.
//
// Every error Resolve returns for a bad image wraps one of ErrNotLocal,
// ErrNotFound or ErrInvalid; its text names the image as the caller gave
// it and never a path inside the store. Other errors (a full disk, a
// cancelled context) wrap none of them.
package rootfs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// The error kinds of Resolve.
var (
	// ErrNotLocal: the image is not an absolute path (a registry reference
	// such as "ubuntu:22.04", or empty). The local provider cannot run it;
	// the docker provider can.
	ErrNotLocal = errors.New("not a local image (a rootfs directory or an image tarball, by absolute path)")
	// ErrNotFound: nothing at the path, or no image in the tarball matches
	// the selector.
	ErrNotFound = errors.New("image not found")
	// ErrInvalid: the path holds something that is not a usable image: a
	// directory without bin or usr, a file that is not an image tarball, a
	// malformed or corrupt tarball, an image for another platform, several
	// images and no selector.
	ErrInvalid = errors.New("invalid image")
)

// Image is a resolved image.
type Image struct {
	// Dir is the root filesystem, to mount read-only as the overlay's lower
	// layer. It must not be written to: for a tarball it is shared by every
	// sandbox of that image; for a directory it is the caller's own.
	Dir string
	// Digest is the image's config digest ("sha256:…"), the cache key;
	// empty for a directory.
	Digest string
	// Config is the image's run configuration; zero for a directory.
	Config ImageConfig
}

// ImageConfig is the part of an image's config a sandbox runs with, as
// written in the image (nothing defaulted).
type ImageConfig struct {
	Env        []string // KEY=value
	Workdir    string
	Entrypoint []string
	Cmd        []string
	User       string // "uid", "uid:gid", "name" or "name:group", as in the image
}

// Store is a cache of unpacked image tarballs in one directory:
//
//	<dir>/sha256/<hex>/rootfs  the unpacked image whose config digest is sha256:<hex>
//	<dir>/tmp/                 unpacks in progress
//
// An image is unpacked under tmp and renamed into sha256/ only once it is
// complete and synced, so an entry under sha256/ is always whole; Open
// removes whatever a crash left in tmp. Entries are never removed.
//
// A Store is safe for concurrent use. A directory belongs to one Store (one
// process) at a time: Open clears tmp, which would break another process's
// unpack in progress.
type Store struct {
	dir string
	// Log gets a line when an unpack starts and ends; nil: slog.Default.
	Log *slog.Logger

	mu      sync.Mutex
	flights map[string]*flight // by config digest hex; guarded by mu

	unpacks atomic.Int64 // unpacks started; for tests
}

// flight is one unpack in progress; done is closed when err is set.
type flight struct {
	done    chan struct{}
	err     error
	waiters int // calls waiting for it now; guarded by Store.mu; for tests
}

// Open returns the store in dir, creating dir (mode 0700) if needed. The
// directory must be owned by the calling user, since whoever can write it
// can change what every sandbox of a cached image runs; Open resets its
// mode to 0700, which also keeps the images' setuid files out of other
// host users' reach. Unpacking needs root (it sets ownership as in the
// image).
func Open(dir string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("image store %q: not an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("image store %s: not a directory", dir)
	}
	if int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("image store %s: owned by uid %d, not by uid %d", dir, st.Uid, os.Geteuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	s := &Store{dir: dir, flights: map[string]*flight{}}
	// Removing and recreating tmp drops any half unpack a crash left.
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("image store: clear tmp: %w", err)
	}
	for _, d := range []string{s.tmpDir(), filepath.Join(dir, "sha256")} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	return s, nil
}

func (s *Store) tmpDir() string { return filepath.Join(s.dir, "tmp") }

// entry is where the image with config digest sha256:<key> lives.
func (s *Store) entry(key string) string { return filepath.Join(s.dir, "sha256", key) }

// Resolve returns the image named by image (see the package doc for the
// forms it takes). For a tarball it blocks while the image is unpacked, if
// it is not in the store yet; concurrent calls for the same image share one
// unpack, each waiting until it ends or its own ctx is done. If the unpack
// was abandoned because its caller's ctx ended, a waiter starts its own.
//
// Errors wrap ErrNotLocal, ErrNotFound or ErrInvalid (see their docs), or
// none of them for a failure of the host or ctx.
func (s *Store) Resolve(ctx context.Context, image string) (Image, error) {
	if image == "" || !filepath.IsAbs(image) {
		return Image{}, fmt.Errorf("image %q: %w", image, ErrNotLocal)
	}
	r, err := parseRef(image)
	if err != nil {
		return Image{}, err
	}
	if r.dir {
		return resolveDir(image, r.path)
	}
	return s.resolveTar(ctx, image, r)
}

// ref is a parsed local image name.
type ref struct {
	path   string // the directory or tarball, cleaned
	dir    bool
	tag    string // selector: repo:tag, as written
	digest string // selector: sha256:<hex>
}

// parseRef splits image into a path and a selector. The whole string is a
// path if something exists there; else a selector is split off: after the
// last '@' if that is followed by sha256:, else after the first ':' that
// leaves a regular file.
func parseRef(image string) (ref, error) {
	if fi, err := os.Stat(image); err == nil {
		// Not opened unless a regular file: opening a device can act.
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			return ref{}, fmt.Errorf("image %s: neither a directory nor a regular file: %w", image, ErrInvalid)
		}
		return ref{path: filepath.Clean(image), dir: fi.IsDir()}, nil
	}
	if i := strings.LastIndex(image, "@"); i > 0 && strings.HasPrefix(image[i+1:], "sha256:") {
		if _, err := v1.NewHash(image[i+1:]); err != nil {
			return ref{}, fmt.Errorf("image %q: bad digest: %w", image, ErrInvalid)
		}
		r := ref{path: filepath.Clean(image[:i]), digest: image[i+1:]}
		return r, fileExists(image, r.path)
	}
	for i := 0; i < len(image); i++ {
		if image[i] != ':' {
			continue
		}
		if fi, err := os.Stat(image[:i]); err == nil && fi.Mode().IsRegular() {
			if image[i+1:] == "" {
				return ref{}, fmt.Errorf("image %q: empty tag: %w", image, ErrInvalid)
			}
			return ref{path: filepath.Clean(image[:i]), tag: image[i+1:]}, nil
		}
	}
	return ref{}, fmt.Errorf("image %s: no such file or directory: %w", image, ErrNotFound)
}

// fileExists checks that the tarball part of image exists and is a
// regular file.
func fileExists(image, p string) error {
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("image %s: no such file: %w", image, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("image %s: %w", image, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("image %s: not a regular file: %w", image, ErrInvalid)
	}
	return nil
}

// resolveDir accepts a directory that looks like a root filesystem.
func resolveDir(image, dir string) (Image, error) {
	for _, d := range []string{"bin", "usr"} {
		if _, err := os.Lstat(filepath.Join(dir, d)); err == nil {
			return Image{Dir: dir}, nil
		}
	}
	return Image{}, fmt.Errorf("image %s: not a root filesystem (it has neither bin nor usr): %w", image, ErrInvalid)
}

// resolveTar reads the image's metadata from the tarball and unpacks it
// unless the store has it.
func (s *Store) resolveTar(ctx context.Context, image string, r ref) (Image, error) {
	a, err := openArchive(image, r.path)
	if err != nil {
		return Image{}, err
	}
	defer a.Close()
	img, err := a.selectImage(r)
	if err != nil {
		return Image{}, err
	}
	key := img.digest.Hex
	if err := s.ensure(ctx, key, func(dst string) error {
		// The first create of an image waits for its unpack, which can
		// take seconds for a large one: say so, and how long it took.
		log := s.Log
		if log == nil {
			log = slog.Default()
		}
		start := time.Now()
		log.Info("unpacking image (creates of it wait)", "image", filepath.Base(image), "digest", key)
		err := unpackImage(ctx, image, img, dst)
		if err != nil {
			log.Warn("unpack image failed", "image", filepath.Base(image), "digest", key, "after", time.Since(start).Round(time.Millisecond), "err", err)
		} else {
			log.Info("image unpacked", "image", filepath.Base(image), "digest", key, "duration", time.Since(start).Round(time.Millisecond))
		}
		return err
	}); err != nil {
		return Image{}, err
	}
	c := img.config.Config
	return Image{
		Dir:    filepath.Join(s.entry(key), "rootfs"),
		Digest: img.digest.String(),
		Config: ImageConfig{Env: c.Env, Workdir: c.WorkingDir, Entrypoint: c.Entrypoint, Cmd: c.Cmd, User: c.User},
	}, nil
}

// ensure makes the store hold entry key, calling unpack(dst) to write a
// new one into a fresh directory dst unless the entry exists or another
// call is making it (then it waits for that one).
func (s *Store) ensure(ctx context.Context, key string, unpack func(dst string) error) error {
	for {
		if _, err := os.Lstat(s.entry(key)); err == nil {
			return nil
		}
		s.mu.Lock()
		f, waiting := s.flights[key]
		if waiting {
			f.waiters++
		} else {
			f = &flight{done: make(chan struct{})}
			s.flights[key] = f
		}
		s.mu.Unlock()
		if !waiting {
			f.err = s.unpackEntry(key, unpack)
			s.mu.Lock()
			delete(s.flights, key)
			s.mu.Unlock()
			close(f.done)
			return f.err
		}
		var err error
		select {
		case <-f.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		s.mu.Lock()
		f.waiters--
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if f.err == nil {
			return nil
		}
		// The leader's own ctx ended: not our failure, try again.
		if !errors.Is(f.err, context.Canceled) && !errors.Is(f.err, context.DeadlineExceeded) {
			return f.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// unpackEntry unpacks into a temporary directory and renames it into place
// once everything in it is on disk.
func (s *Store) unpackEntry(key string, unpack func(dst string) error) (err error) {
	if _, err := os.Lstat(s.entry(key)); err == nil {
		return nil // finished by the previous flight after our first look
	}
	s.unpacks.Add(1)
	tmp := filepath.Join(s.tmpDir(), key[:min(12, len(key))]+"-"+randSuffix())
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	root := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	if err := unpack(root); err != nil {
		return err
	}
	if err := syncfs(tmp); err != nil {
		return fmt.Errorf("unpack: sync: %w", err)
	}
	if err := os.Rename(tmp, s.entry(key)); err != nil {
		if _, serr := os.Lstat(s.entry(key)); serr == nil {
			// Another process sharing the directory (against the rules)
			// won the race; its copy has the same content.
			os.RemoveAll(tmp)
			return nil
		}
		return fmt.Errorf("unpack: %w", err)
	}
	if err := fsyncDir(filepath.Join(s.dir, "sha256")); err != nil {
		return fmt.Errorf("unpack: sync: %w", err)
	}
	return nil
}

// fsyncDir makes a rename into dir durable.
func fsyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// syncfs flushes the filesystem holding dir: one call covers every file an
// unpack wrote, where an fsync per file would cost one flush each.
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func randSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}
