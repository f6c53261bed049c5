package local

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
// formatted ext4 and mounted through a loop device in the sandbox's mount
// namespace only; its upper layer and work directory live there. A sandbox
// that writes past its size gets ENOSPC; the host gains at most that much,
// and gets it back when the sandbox is deleted (the loop device is
// auto-cleared when the namespace's last mount of it goes).

const diskImage = "disk.img"

// minDiskBytes is the smallest disk limit: room for ext4's own metadata
// and the overlay's work directory, with space to spare.
const minDiskBytes = 64 << 20

// mkfsPaths are where Debian and others keep mkfs.ext4 (setup runs with an
// empty environment, so no PATH lookup).
var mkfsPaths = []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4", "/usr/bin/mkfs.ext4"}

// findMkfs returns the path of mkfs.ext4 and checks loop devices exist, or
// says why disk limits cannot be enforced.
func findMkfs() (string, error) {
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "", fmt.Errorf("no loop devices (/dev/loop-control: %w)", err)
	}
	for _, p := range mkfsPaths {
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found (install e2fsprogs)")
}

// makeDisk creates dir/disk.img of size bytes holding an empty ext4
// filesystem and mounts it at target in the caller's mount namespace. Runs
// in setup, as host root. The image is a sparse copy of a template
// formatted once per size (in templates), which saves mkfs (~5 ms) on
// every create; the copies share a filesystem UUID, which ext4 does not
// mind.
func makeDisk(mkfs, templates, dir, target string, size int64) error {
	tpl, err := diskTemplate(mkfs, templates, size)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dir+"/"+diskImage, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	defer f.Close()
	if err := copySparse(f, tpl, size); err != nil {
		return fmt.Errorf("copy disk template: %w", err)
	}
	loop, err := attachLoop(f)
	if err != nil {
		return err
	}
	// The mount takes its own reference; closing ours after it arms
	// autoclear (closing before would detach the device at once).
	defer loop.Close()
	if err := unix.Mount(loop.Name(), target, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount disk image: %w", err)
	}
	return nil
}

// diskTemplate returns the template of an empty filesystem of size bytes,
// formatting it if there is none yet (made aside and renamed into place,
// so a concurrent create never sees half of one).
func diskTemplate(mkfs, templates string, size int64) (string, error) {
	tpl := fmt.Sprintf("%s/ext4-%d.img", templates, size)
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
	// No journal (scratch space: a crash loses the sandbox anyway), no
	// reserved blocks, inode tables initialised lazily.
	out, err := exec.Command(mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode",
		"-E", "lazy_itable_init=1,nodiscard", tmp).CombinedOutput()
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
