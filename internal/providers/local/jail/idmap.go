package jail

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// idMapping maps sandbox ids 0..65535 to host ids base..base+65535.
func idMapping(base uint32) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: IDMapSize}}
}

// mountIdmapped mounts a non-recursive clone of src at dst, read-only, with
// its ids shifted through userns: a file the host sees as owned by uid u
// appears as owned by u's image in userns (host root's files look
// root-owned to sandbox root). Extra mount attributes (MOUNT_ATTR_NOSUID,
// …) are added to the read-only one. The caller is host root in a mount
// namespace of its own.
func mountIdmapped(src, dst string, userns *os.File, attrs uint64) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer unix.Close(fd)
	return attachIdmapped(fd, dst, userns, unix.MOUNT_ATTR_RDONLY|attrs)
}

// attachIdmapped id-maps the detached mount fd through userns (nodev, plus
// attrs) and attaches it at dst.
func attachIdmapped(fd int, dst string, userns *os.File, attrs uint64) error {
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NODEV | attrs,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s: %w", dst, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach %s: %w", dst, err)
	}
	return nil
}

// IDMapSize is the number of ids a sandbox owns (uids and gids alike).
const IDMapSize = 65536
