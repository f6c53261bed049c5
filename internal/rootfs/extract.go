package rootfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"golang.org/x/sys/unix"
)

// unpackImage flattens img's layers into dir, an empty directory, with
// mutate.Extract, then writes the result with unpack. Extract fails on a
// name that climbs out ("../x"; ErrInvalid here), and drops links whose
// relative target climbs out and entries below a symlink or another
// non-directory; unpack does not rely on any of that.
func unpackImage(ctx context.Context, image string, img *tarImage, dir string) error {
	v1img, err := partial.UncompressedToImage(img)
	if err != nil {
		return fmt.Errorf("image %s: %w", image, err)
	}
	// Extract reads the layers in a goroutine of its own. unpack reads rc
	// to its end on success, which is that goroutine's last act; after a
	// failure, closing rc makes its next write fail and it returns. It
	// cannot be joined: mutate gives no handle.
	rc := mutate.Extract(v1img)
	defer rc.Close()
	if err := unpack(ctx, rc, dir); err != nil {
		return fmt.Errorf("image %s: %w", image, err)
	}
	return nil
}

// unpack writes the tar stream r into dir, an empty directory, and returns
// when r ends. r is a flattened image as mutate.Extract produces it: upper
// layers first, whiteouts applied, each path at most once (an upper
// layer's entry wins, so an existing name is never replaced; a directory
// made implicitly for a child takes the metadata of a later entry).
//
// Nothing is written outside dir, whatever r holds: names are taken
// relative to dir ("/a" and "../a" are dir/a) and every parent directory is
// resolved with openat2(RESOLVE_IN_ROOT), so a symlink on the way is
// followed as if dir were /; the last component is never followed.
//
// Kept: regular files, directories, symlinks, hard links (to a target
// inside dir), FIFOs; numeric uid/gid, mode including setuid/setgid/sticky,
// mtime and atime, and the xattrs user.* (but user.overlay.*, which the
// root overlay would act on) and security.capability. Skipped: character
// and block devices (a sandbox gets its own /dev), other xattrs.
//
// Hard links are made last, as their target may come later in r (from a
// lower layer). The flattened stream cannot tell which layer a target name
// came from, so a link whose target a higher layer deleted is dropped, and
// one whose target a higher layer replaced links to the replacement.
//
// Errors reading r, and an entry that cannot be placed (a directory
// through a dangling symlink, a hard link to a directory), wrap
// ErrInvalid; ctx's error is returned as is.
func unpack(ctx context.Context, r io.Reader, dir string) error {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	defer unix.Close(root)
	u := &unpacker{ctx: ctx, root: root, buf: make([]byte, 256<<10)}
	cr := ctxReader{ctx, r}
	tr := tar.NewReader(cr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			// mutate.Extract ends the tar before it reports a failure (a
			// layer missing or not matching its diff_id): the error comes
			// after the end-of-archive marker.
			if _, err := io.Copy(io.Discard, cr); err != nil {
				return u.streamErr(err)
			}
			break
		}
		if err != nil {
			return u.streamErr(err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return err
		}
	}
	if err := u.hardlinks(); err != nil {
		return err
	}
	// Last, since making anything in a directory changes its mtime.
	for _, d := range u.dirs {
		if err := u.setTimes(d.rel, d.hdr); err != nil {
			return err
		}
	}
	return nil
}

type unpacker struct {
	ctx   context.Context
	root  int    // O_PATH descriptor of the target directory
	buf   []byte // file copy buffer
	dirs  []dirEntry
	links []*tar.Header
}

type dirEntry struct {
	rel string
	hdr *tar.Header
}

// ctxReader fails reads once ctx is done, so a large file stops too.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// streamErr classifies an error reading the stream: ctx's own, or a fault
// of the image.
func (u *unpacker) streamErr(err error) error {
	if cerr := u.ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, ErrInvalid) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrInvalid, err)
}

func invalidEntry(rel, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", rel, fmt.Sprintf(format, args...), ErrInvalid)
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel := cleanRel(hdr.Name)
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= math.MaxUint32 || hdr.Gid >= math.MaxUint32 {
		return invalidEntry(rel, "uid/gid %d/%d out of range", hdr.Uid, hdr.Gid)
	}
	if rel == "." && hdr.Typeflag != tar.TypeDir {
		return nil // cannot replace the root
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(rel, hdr)
	case tar.TypeReg:
		return u.file(rel, hdr, r)
	case tar.TypeSymlink:
		return u.symlink(rel, hdr)
	case tar.TypeLink:
		u.links = append(u.links, hdr)
		return nil
	case tar.TypeFifo:
		return u.fifo(rel, hdr)
	}
	return nil // devices, and types that are not files
}

// parent returns an O_PATH descriptor of rel's parent, made if missing,
// and rel's last component.
func (u *unpacker) parent(rel string) (fd int, base string, err error) {
	fd, err = u.dirAt(path.Dir(rel), true)
	return fd, path.Base(rel), err
}

// dirAt returns an O_PATH descriptor of directory rel, resolved inside the
// root. With create, missing directories are made (mode 0755, owned by the
// caller) until an entry of the stream sets their metadata.
func (u *unpacker) dirAt(rel string, create bool) (int, error) {
	fd, err := openInRoot(u.root, rel, unix.O_PATH|unix.O_DIRECTORY)
	switch {
	case err == nil:
		return fd, nil
	case errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV):
		return -1, invalidEntry(rel, "not a directory")
	case !create || rel == "." || !errors.Is(err, unix.ENOENT):
		return -1, fmt.Errorf("%s: %w", rel, err)
	}
	pfd, err := u.dirAt(path.Dir(rel), true)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	switch err := unix.Mkdirat(pfd, base, 0o755); {
	case err == nil:
		// Mkdirat is subject to the umask.
		if err := unix.Fchmodat(pfd, base, 0o755, 0); err != nil {
			return -1, fmt.Errorf("%s: %w", rel, err)
		}
	case errors.Is(err, unix.EEXIST):
		// Not found by openInRoot, yet here: a dangling symlink.
	default:
		return -1, fmt.Errorf("%s: %w", rel, err)
	}
	fd, err = unix.Openat(pfd, base, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return -1, invalidEntry(rel, "a symlink on the path leads nowhere")
	}
	if err != nil {
		return -1, fmt.Errorf("%s: %w", rel, err)
	}
	return fd, nil
}

// openInRoot opens rel below root as if root were "/": "..", absolute
// symlinks and magic links cannot leave it, and no mount point is crossed.
func openInRoot(root int, rel string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for range 128 {
		fd, err := unix.Openat2(root, rel, &how)
		// EAGAIN: a rename raced the lookup; nothing else writes here, but
		// retry as documented.
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
	return -1, fmt.Errorf("%s: %w", rel, unix.EAGAIN)
}

func (u *unpacker) dir(rel string, hdr *tar.Header) error {
	var pfd int
	var base string
	var err error
	if rel == "." {
		pfd, err = u.dirAt(".", false)
		base = "."
	} else {
		pfd, base, err = u.parent(rel)
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if rel != "." {
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%s: %w", rel, err)
		}
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return nil // an upper layer's non-directory holds the name
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(fd)
	if err := setOwnerMode(fd, rel, hdr); err != nil {
		return err
	}
	u.dirs = append(u.dirs, dirEntry{rel, hdr})
	return nil
}

func (u *unpacker) file(rel string, hdr *tar.Header, r io.Reader) error {
	pfd, base, err := u.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EEXIST) {
		return nil // an upper layer's entry holds the name
	}
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(fd)
	for {
		n, rerr := r.Read(u.buf)
		if n > 0 {
			if err := writeAll(fd, u.buf[:n]); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return u.streamErr(rerr)
		}
	}
	if err := setOwnerMode(fd, rel, hdr); err != nil {
		return err
	}
	return u.setTimesAt(pfd, base, rel, hdr)
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// setOwnerMode sets fd's owner, then its mode (a chown clears setuid and
// setgid), then its xattrs.
func setOwnerMode(fd int, rel string, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("%s: chown: %w", rel, err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("%s: chmod: %w", rel, err)
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !keepXattr(name) {
			continue
		}
		err := unix.Fsetxattr(fd, name, []byte(v), 0)
		if err != nil && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("%s: set xattr %s: %w", rel, name, err)
		}
	}
	return nil
}

// keepXattr says which xattrs of an image are kept: file capabilities and
// user.*, except user.overlay.*, which the sandbox's root overlay (mounted
// with userxattr) would read as its own whiteout and redirect metadata.
// trusted.* and security.selinux mean nothing on this host.
func keepXattr(name string) bool {
	if name == "security.capability" {
		return true
	}
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.")
}

func (u *unpacker) symlink(rel string, hdr *tar.Header) error {
	pfd, base, err := u.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: chown: %w", rel, err)
	}
	return u.setTimesAt(pfd, base, rel, hdr)
}

func (u *unpacker) fifo(rel string, hdr *tar.Header) error {
	pfd, base, err := u.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		return fmt.Errorf("%s: %w", rel, err)
	}
	// Opening a FIFO would block, so these go by name. It is the FIFO just
	// made: nothing else writes here.
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: chown: %w", rel, err)
	}
	if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
		return fmt.Errorf("%s: chmod: %w", rel, err)
	}
	return u.setTimesAt(pfd, base, rel, hdr)
}

// hardlinks makes the hard links held back by entry. A link may point at
// another link, so rounds repeat while they make progress.
func (u *unpacker) hardlinks() error {
	pending := u.links
	for len(pending) > 0 {
		var missing []*tar.Header
		for _, hdr := range pending {
			if err := u.ctx.Err(); err != nil {
				return err
			}
			ok, err := u.hardlink(hdr)
			if err != nil {
				return err
			}
			if !ok {
				missing = append(missing, hdr)
			}
		}
		if len(missing) == len(pending) {
			return nil // targets that are not there: dropped
		}
		pending = missing
	}
	return nil
}

// hardlink links hdr's name to its target; ok is false if the target does
// not exist (yet).
func (u *unpacker) hardlink(hdr *tar.Header) (ok bool, err error) {
	rel, target := cleanRel(hdr.Name), cleanRel(hdr.Linkname)
	if target == "." {
		return false, invalidEntry(rel, "hard link to the root")
	}
	tfd, err := u.dirAt(path.Dir(target), false)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(tfd)
	pfd, base, err := u.parent(rel)
	if err != nil {
		return false, err
	}
	defer unix.Close(pfd)
	// Flags 0: a symlink target is linked itself, not followed.
	switch err := unix.Linkat(tfd, path.Base(target), pfd, base, 0); {
	case err == nil, errors.Is(err, unix.EEXIST):
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	case errors.Is(err, unix.EPERM):
		return false, invalidEntry(rel, "hard link to a directory")
	default:
		return false, fmt.Errorf("%s: link: %w", rel, err)
	}
}

// setTimes sets the times of rel, found again from the root.
func (u *unpacker) setTimes(rel string, hdr *tar.Header) error {
	if rel == "." {
		return u.setTimesAt(u.root, "", rel, hdr)
	}
	pfd, err := u.dirAt(path.Dir(rel), false)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return u.setTimesAt(pfd, path.Base(rel), rel, hdr)
}

// setTimesAt sets base's atime and mtime from hdr, not following a
// symlink. An empty base means dirfd itself.
func (u *unpacker) setTimesAt(dirfd int, base, rel string, hdr *tar.Header) error {
	mtime := hdr.ModTime
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	flags := unix.AT_SYMLINK_NOFOLLOW
	if base == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	if err := unix.UtimesNanoAt(dirfd, base, ts, flags); err != nil {
		return fmt.Errorf("%s: set times: %w", rel, err)
	}
	return nil
}

// timespec converts t, clamping times before the epoch (a zero time in a
// tar header) to the epoch.
func timespec(t time.Time) unix.Timespec {
	if t.Unix() < 0 {
		return unix.Timespec{}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}
