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

// makeDisk creates dir/disk.img of size bytes, formats it ext4 with its
// root owned by owner (host uid and gid), and mounts it at target in the
// caller's mount namespace. Runs in setup, as host root.
func makeDisk(mkfs, dir, target string, size int64, owner uint32) error {
	img := dir + "/" + diskImage
	f, err := os.OpenFile(img, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	// No journal (scratch space: a crash loses the sandbox anyway), no
	// reserved blocks, lazy inode tables: formatting takes ~10 ms.
	o := strconv.FormatUint(uint64(owner), 10)
	out, err := exec.Command(mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode",
		"-E", "lazy_itable_init=1,nodiscard,root_owner="+o+":"+o, img).CombinedOutput()
	if err != nil {
		return fmt.Errorf("format disk image: %v: %s", err, strings.TrimSpace(string(out)))
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
