package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Volumes, host side. A volume is a sparse image file of its size,
// formatted like a sandbox's disk (from the same templates) and mounted
// through a loop device at <dir>/mnt in the gateway's own mount
// namespace, so that every sandbox of the local provider and every
// container of the docker one can bind it, and a write past its size
// fails with ENOSPC. Its files are kept with sandbox-relative ids: a local
// sandbox binds it id-mapped through its user namespace (sandbox root's
// files are uid 0 on disk), which is what root in a container sees too, so
// whatever one sandbox writes another reads and writes as its own root.
const (
	VolumeImage = "volume.img"
	VolumeMnt   = "mnt"
	volumeFS    = "fs" // names the image's filesystem, for RemountVolumes
)

// MakeVolume creates the volume in dir (which must not exist) of size
// bytes, a filesystem of kind fs, and mounts it (MountVolume). On error
// nothing is left.
func MakeVolume(fs, mkfs, templates, dir string, size int64) (err error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("volume directory: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := os.Mkdir(filepath.Join(dir, VolumeMnt), 0o755); err != nil {
		return err
	}
	tpl, err := diskTemplate(fs, mkfs, templates, size)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, VolumeImage), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create volume image: %w", err)
	}
	err = copySparse(f, tpl, size)
	f.Close()
	if err != nil {
		return fmt.Errorf("copy volume template: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, volumeFS), []byte(fs), 0o600); err != nil {
		return err
	}
	return MountVolume(fs, dir)
}

// RemountVolumes mounts every volume in parent (one directory each; other
// directories are skipped) that is not mounted, as after the host restarted (a gateway restart finds
// them mounted), and calls failed for each that cannot be: it stays
// for its delete.
func RemountVolumes(parent string, failed func(name string, err error)) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(parent, e.Name())
		fs, err := os.ReadFile(filepath.Join(dir, volumeFS))
		if errors.Is(err, os.ErrNotExist) {
			continue // not a volume (or one whose create failed midway)
		}
		if err == nil {
			err = MountVolume(string(fs), dir)
		}
		if err != nil {
			failed(e.Name(), err)
		}
	}
}

// StageBind mounts directory sub inside src (resolved by OpenBeneath) at
// dst, which it creates: a path with no symlink a sandbox could swap, for
// a runtime that binds by path (docker). The caller removes it with
// Unstage once the runtime has made its own mount of it.
func StageBind(src, sub, dst string) error {
	dfd, err := OpenBeneath(src, sub)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.OpenTree(dfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("clone %s: %w", sub, err)
	}
	defer unix.Close(fd)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		os.Remove(dst)
		return fmt.Errorf("attach %s: %w", dst, err)
	}
	return nil
}

// Unstage detaches what StageBind mounted at dst and removes dst.
func Unstage(dst string) error {
	if err := unix.Unmount(dst, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// MountVolume mounts the volume in dir at dir/mnt unless it is mounted
// already (a gateway restarted on a running host finds it so).
func MountVolume(fs, dir string) error {
	mnt := filepath.Join(dir, VolumeMnt)
	if mounted, err := isMountPoint(mnt); err != nil || mounted {
		return err
	}
	img := filepath.Join(dir, VolumeImage)
	// Sandboxes may still hold the filesystem (their clones of it) though
	// the host's mount went: mounting it from a second loop device would
	// be two live mounts of one filesystem; its own device gives the same
	// superblock back.
	loop := attachedLoop(img)
	if loop == nil {
		f, err := os.OpenFile(img, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open volume image: %w", err)
		}
		defer f.Close()
		if loop, err = attachLoop(f); err != nil {
			return err
		}
	}
	// Closed after the mount took its reference: autoclear then frees the
	// device once the volume is unmounted.
	defer loop.Close()
	mfd, err := mountDevice(fs, loop.Name(), "", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("mount volume: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, mnt, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach volume at %s: %w", mnt, err)
	}
	return nil
}

// VolumeMounted reports whether the volume in dir is mounted: only then is
// dir/mnt its filesystem (else an empty directory of the state dir's,
// with no size limit).
func VolumeMounted(dir string) bool {
	ok, err := isMountPoint(filepath.Join(dir, VolumeMnt))
	return err == nil && ok
}

// attachedLoop opens the loop device backed by file img, if there is one.
func attachedLoop(img string) *os.File {
	if real, err := filepath.EvalSymlinks(img); err == nil {
		img = real // the kernel names the file as resolved
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, bf := range files {
		b, err := os.ReadFile(bf)
		if err != nil || strings.TrimSuffix(string(b), "\n") != img {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(bf)))
		if f, err := os.OpenFile(dev, os.O_RDWR, 0); err == nil {
			return f
		}
	}
	return nil
}

// RemoveVolume unmounts the volume in dir (lazily: a sandbox that still
// holds it keeps its view until it goes) and removes its image.
func RemoveVolume(dir string) error {
	mnt := filepath.Join(dir, VolumeMnt)
	if mounted, err := isMountPoint(mnt); err == nil && mounted {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount volume: %w", err)
		}
	}
	return os.RemoveAll(dir)
}

// isMountPoint reports whether p is the root of a mount other than its
// parent's.
func isMountPoint(p string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(p), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino, nil
}

// OpenBeneath opens directory sub (relative; "" for root itself) inside
// root as an O_PATH descriptor, refusing any path that leaves root: by
// "..", by a symlink (absolute, or relative and climbing out) or by a
// magic link. It is how a volume's sub_path is resolved, since a sandbox
// that writes the volume may have planted a symlink in it.
func OpenBeneath(root, sub string) (int, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", root, err)
	}
	if sub == "" || sub == "." {
		return rfd, nil
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, sub, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("sub_path %q: %w", sub, err)
	}
	return fd, nil
}

// SubPathProblem says, for a client, why OpenBeneath refused a sub_path.
func SubPathProblem(err error) string {
	switch {
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.ELOOP):
		return "leaves the volume (a symlink on the way points out of it)"
	case errors.Is(err, unix.ENOENT):
		return "does not exist"
	case errors.Is(err, unix.ENOTDIR):
		return "is not a directory"
	}
	return "cannot be opened"
}

// VolumeBind is one volume mount of a sandbox: Source (a volume's mnt, or
// an operator-allowed host directory) at Sub inside it, mounted at Target
// inside the sandbox.
type VolumeBind struct {
	Source   string `json:"source"`
	Sub      string `json:"sub,omitempty"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// volDir is where setup stages volume i for init (relative to the
// sandbox's directory).
func volDir(i int) string { return fmt.Sprintf("vol%d", i) }

// mountVolumes mounts each of cfg.Volumes, id-mapped through userns (so
// sandbox root owns what host root owns on the volume), at vol<i> in
// the sandbox's directory: a non-recursive clone of the directory
// OpenBeneath resolved, read-only when asked. The read-only flag of a
// mount made here is locked for init's less privileged mount namespace:
// nothing inside can remount it writable.
func mountVolumes(cfg Config, userns *os.File) error {
	for i, v := range cfg.Volumes {
		dfd, err := OpenBeneath(v.Source, v.Sub)
		if err != nil {
			return err
		}
		fd, err := unix.OpenTree(dfd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
		unix.Close(dfd)
		if err != nil {
			return fmt.Errorf("clone volume %d: %w", i, err)
		}
		attrs := uint64(unix.MOUNT_ATTR_NOSUID)
		if v.ReadOnly {
			attrs |= unix.MOUNT_ATTR_RDONLY
		}
		err = attachIdmapped(fd, filepath.Join(cfg.Dir, volDir(i)), userns, attrs)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// bindVolumes binds the staged volumes at their targets in the new root
// (init, before the pivot; root is the new root relative to the working
// directory). A target is resolved and made inside root, as if root were
// /, so that a symlink in the image cannot place the mount elsewhere.
func bindVolumes(cfg Config, root string) error {
	if len(cfg.Volumes) == 0 {
		return nil
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the new root: %w", err)
	}
	defer unix.Close(rfd)
	for i, v := range cfg.Volumes {
		dst, err := mkdirInRoot(rfd, v.Target)
		if err != nil {
			return fmt.Errorf("create %s: %w", v.Target, err)
		}
		src, err := unix.OpenTree(unix.AT_FDCWD, volDir(i), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err == nil {
			err = unix.MoveMount(src, "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
			unix.Close(src)
		}
		unix.Close(dst)
		if err != nil {
			return fmt.Errorf("bind volume at %s: %w", v.Target, err)
		}
	}
	return nil
}

// inRoot resolves paths beneath a root as if it were / (symlinks
// included), never outside it.
var inRoot = unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}

// mkdirInRoot makes directory p (absolute, clean) and its parents inside
// the root rfd and returns it opened (O_PATH).
func mkdirInRoot(rfd int, p string) (int, error) {
	at := "/"
	for _, name := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		next := at + name
		if fd, err := unix.Openat2(rfd, next, &inRoot); err == nil {
			unix.Close(fd)
		} else if errors.Is(err, unix.ENOENT) {
			parent, err := unix.Openat2(rfd, at, &inRoot)
			if err != nil {
				return -1, err
			}
			err = unix.Mkdirat(parent, name, 0o755)
			unix.Close(parent)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, err
			}
		} else {
			return -1, err
		}
		at = next + "/"
	}
	return unix.Openat2(rfd, p, &inRoot)
}
