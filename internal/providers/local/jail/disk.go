package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A sandbox's disk limit. The kernel here has no quota format for ext4
// project quotas and no XFS quota, so each sandbox with a limit gets a
// filesystem of its own: a sparse file in its directory (disk.img),
// formatted btrfs (ext4 where btrfs-progs is missing) and mounted through a
// loop device in the sandbox's mount namespace only; its upper layer and
// work directory live there. A sandbox that writes past its size gets
// ENOSPC; the host gains at most that much, and gets it back when the
// sandbox is deleted (the loop device is auto-cleared when the last mount
// of it goes).
//
// The filesystem is mounted id-mapped through the sandbox's user
// namespace, so what it holds is owned as the sandbox sees it (sandbox
// root's files by uid 0), like an image's: a snapshot of it (snapshot.go)
// serves any sandbox, whatever its id range.

const DiskImage = "disk.img"

// MinDiskBytes is the smallest disk limit: room for the filesystem's own
// metadata and the overlay's work directory, with space to spare.
const MinDiskBytes = 64 << 20

// Disk filesystems. Only btrfs can snapshot (a read-only subvolume
// snapshot: O(1) in what the sandbox wrote).
const (
	FSBtrfs = "btrfs"
	FSExt4  = "ext4"
)

// The overlay's directories on a sandbox's filesystem: upper and work in
// LayerDir, which on btrfs is a subvolume (a snapshot takes it whole;
// btrfs renames nothing across subvolumes, so work must be in it too).
const (
	LayerDir = "layer"
	upperDir = LayerDir + "/upper"
	workDir  = LayerDir + "/work"
)

// sbinDirs are where Debian and others keep mkfs.* (setup runs with an
// empty environment, so no PATH lookup).
var sbinDirs = []string{"/usr/sbin", "/sbin", "/usr/bin"}

// FindMkfs returns the disk filesystem to use (want, or btrfs if its mkfs
// is there, else ext4) and the path of its mkfs, after checking loop
// devices exist; or says why disk limits cannot be enforced.
func FindMkfs(want string) (fs, mkfs string, err error) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "", "", fmt.Errorf("no loop devices (/dev/loop-control: %w)", err)
	}
	kinds := []string{FSBtrfs, FSExt4}
	if want != "" {
		kinds = []string{want}
	}
	for _, kind := range kinds {
		for _, d := range sbinDirs {
			p := d + "/mkfs." + kind
			if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
				return kind, p, nil
			}
		}
	}
	if want == FSBtrfs {
		return "", "", errors.New("mkfs.btrfs not found (install btrfs-progs)")
	}
	return "", "", errors.New("mkfs.ext4 not found (install e2fsprogs)")
}

// makeDisk creates dir/disk.img of size bytes holding an empty filesystem
// of kind fs, with the overlay's upper and work directories, and returns it
// mounted but not attached anywhere (a detached mount, for mountLayers to
// id-map and attach). Runs in setup, as host root. The image is a sparse
// copy of a template formatted once per size (in templates), which saves
// mkfs (5-40 ms) on every create; the copies share a filesystem UUID,
// which ext4 does not mind and btrfs handles (each clone mounted gets a
// temporary one).
func makeDisk(fs, mkfs, templates, dir string, size int64) (int, error) {
	return MakeDisk(fs, mkfs, templates, dir+"/"+DiskImage, size)
}

// MakeDisk is makeDisk with the image at img: the provider makes disks
// ahead of creates with it (see Config.DiskFD). A detached mount is no
// part of any mount namespace until attached, so any process of host
// root can make one and hand it on.
func MakeDisk(fs, mkfs, templates, img string, size int64) (int, error) {
	tpl, err := diskTemplate(fs, mkfs, templates, size)
	if err != nil {
		return -1, err
	}
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return -1, fmt.Errorf("create disk image: %w", err)
	}
	defer f.Close()
	if err := copySparse(f, tpl, size); err != nil {
		return -1, fmt.Errorf("copy disk template: %w", err)
	}
	loop, err := attachLoop(f)
	if err != nil {
		return -1, err
	}
	// The mount takes its own reference; closing ours after it arms
	// autoclear (closing before would detach the device at once).
	defer loop.Close()
	mfd, err := mountDevice(fs, loop.Name(), "", unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("mount disk image: %w", err)
	}
	if err := makeOverlayDirs(mfd, fs); err != nil {
		unix.Close(mfd)
		return -1, err
	}
	return mfd, nil
}

// makeOverlayDirs makes LayerDir (a subvolume on btrfs) with upper and
// work in it, at the root of the detached mount mfd, owned by the
// sandbox's root once id-mapped.
func makeOverlayDirs(mfd int, fs string) error {
	root, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the disk's root: %w", err)
	}
	defer unix.Close(root)
	if fs == FSBtrfs {
		err = btrfsSubvolCreate(root, LayerDir)
	} else {
		err = unix.Mkdirat(root, LayerDir, 0o755)
	}
	if err != nil {
		return fmt.Errorf("make the upper layer: %w", err)
	}
	for _, d := range []string{upperDir, workDir} {
		if err := unix.Mkdirat(root, d, 0o755); err != nil {
			return fmt.Errorf("make %s: %w", d, err)
		}
	}
	return nil
}

// mountDevice mounts the filesystem of kind fs on dev (subvol, on btrfs,
// picks a subvolume; "" the top) and returns the mount detached, with
// attrs (MOUNT_ATTR_*).
func mountDevice(fs, dev, subvol string, attrs int) (int, error) {
	fsfd, err := unix.Fsopen(fs, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fs, err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", dev); err != nil {
		return -1, fmt.Errorf("source %s: %w", dev, err)
	}
	if subvol != "" {
		if err := unix.FsconfigSetString(fsfd, "subvol", subvol); err != nil {
			return -1, fmt.Errorf("subvol %s: %w", subvol, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("mount %s: %w", dev, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", dev, err)
	}
	return mfd, nil
}

// diskTemplate returns the template of an empty filesystem of kind fs and
// size bytes, formatting it if there is none yet (made aside and renamed
// into place, so a concurrent create never sees half of one).
func diskTemplate(fs, mkfs, templates string, size int64) (string, error) {
	tpl := fmt.Sprintf("%s/%s-%d.img", templates, fs, size)
	if _, err := os.Stat(tpl); err == nil {
		return tpl, nil
	}
	if err := os.MkdirAll(templates, 0o700); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", tpl, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return "", err
	}
	var args []string
	switch fs {
	case FSBtrfs:
		// Single copies of metadata (scratch space: a crash loses the
		// sandbox anyway); mixed block groups below 1 GiB, where separate
		// data and metadata groups waste most of the space.
		args = []string{"-q", "-f", "-m", "single", "-d", "single"}
		if size < 1<<30 {
			args = append(args, "-M")
		}
	default:
		// No journal, no reserved blocks, inode tables initialised lazily.
		args = []string{"-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1,nodiscard"}
	}
	out, err := exec.Command(mkfs, append(args, tmp)...).CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("format disk image: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return tpl, os.Rename(tmp, tpl)
}

// copySparse copies the data extents of the file at src into dst and
// sizes dst to size: the holes stay holes (a plain copy would write them
// out as zeros).
func copySparse(dst *os.File, src string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := dst.Truncate(size); err != nil {
		return err
	}
	sfd, dfd := int(in.Fd()), int(dst.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for pos := data; pos < hole; {
			soff, doff := pos, pos
			n, err := unix.CopyFileRange(sfd, &soff, dfd, &doff, int(hole-pos), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return errors.New("short copy")
			}
			pos += int64(n)
		}
		off = hole
	}
	return nil
}

// attachLoop binds a free loop device to f with autoclear (the device
// detaches itself once unmounted and closed) and returns it open.
func attachLoop(f *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("loop control: %w", err)
	}
	defer ctl.Close()
	for range 64 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lf, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if err == nil {
			return lf, nil
		}
		lf.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("configure %s: %w", dev, err)
		}
		// Another create took the same device between the two calls.
	}
	return nil, errors.New("no free loop device")
}
