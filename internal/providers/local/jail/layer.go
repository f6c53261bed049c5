package jail

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// layer is a read-only btrfs subvolume in an image under <state>/layers.
type Layer struct {
	Image  string `json:"image"`  // absolute path
	Subvol string `json:"subvol"` // snaps/<sid>
}

// mount mounts the layer read-only (nosuid, nodev) and returns it
// detached.
func (ly Layer) Mount() (int, error) {
	return ly.MountWith(unix.MOUNT_ATTR_RDONLY)
}

// mountWith mounts the layer's subvolume (the whole filesystem for "")
// with attrs and nosuid, nodev, and returns it detached. The image's loop
// device is the one already bound to it, if any: a second one would be a
// second instance of the same filesystem.
func (ly Layer) MountWith(attrs int) (int, error) {
	f, err := os.OpenFile(ly.Image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open layer image: %w", err)
	}
	defer f.Close()
	// One finder or binder at a time per image, across processes.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return -1, err
	}
	attrs |= unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	var last error
	for range 3 {
		loop, err := boundLoop(f)
		if err != nil {
			return -1, err
		}
		if loop == nil {
			if loop, err = attachLoop(f); err != nil {
				return -1, err
			}
		}
		mfd, err := mountDevice(FSBtrfs, loop.Name(), ly.Subvol, attrs)
		loop.Close()
		if err == nil {
			return mfd, nil
		}
		// The device found may have been clearing itself as its last
		// mount went: look again.
		last = err
	}
	return -1, fmt.Errorf("mount layer %s of %s: %w", ly.Subvol, filepath.Base(ly.Image), last)
}

// boundLoop returns the loop device bound to f (open, which keeps it from
// clearing itself), or nil if there is none.
func boundLoop(f *os.File) (*os.File, error) {
	var fi unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &fi); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "loop")
		if !ok {
			continue
		}
		if _, err := strconv.Atoi(n); err != nil {
			continue
		}
		if _, err := os.Stat("/sys/block/" + e.Name() + "/loop/backing_file"); err != nil {
			continue // not bound
		}
		lf, err := os.OpenFile("/dev/"+e.Name(), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(int(lf.Fd()))
		if err == nil && info.Inode == fi.Ino && info.Device == uint64(fi.Dev) {
			return lf, nil
		}
		lf.Close()
	}
	return nil, nil
}
