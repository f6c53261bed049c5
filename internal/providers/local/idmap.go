package local

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ID ranges. Each sandbox owns idMapSize host uids and gids starting at its
// IDBase: sandbox root is host uid IDBase, never host root, so a file or
// kernel object that is not the sandbox's own is as foreign to sandbox
// root as to any unprivileged user. Ranges are numbered from the
// provider's base (Options.IDBase); a sandbox's base is recorded in its
// state.json, so the allocation is rebuilt from disk at start-up and a
// range is free again once the sandbox's directory is gone.

// idMapSize is the number of ids a sandbox owns (uids and gids alike).
const idMapSize = 65536

// maxRanges bounds the allocation: base + maxRanges*idMapSize stays far
// below the 32-bit id space (and its 65534/4294967295 specials).
const maxRanges = 16384

// rangeBase is the first host id of range i.
func rangeBase(base uint32, i int) uint32 { return base + uint32(i)*idMapSize }

// rangeIndex is the inverse of rangeBase, or -1 if id is not a range start.
func rangeIndex(base, id uint32) int {
	if id < base || (id-base)%idMapSize != 0 {
		return -1
	}
	return int((id - base) / idMapSize)
}

// allocRange returns the lowest free range's base and marks it used for
// id. l.mu is held.
func (l *Local) allocRange(id string) (uint32, error) {
	for i := 0; i < maxRanges; i++ {
		if _, used := l.ranges[i]; !used {
			l.ranges[i] = id
			return rangeBase(l.idBase, i), nil
		}
	}
	return 0, fmt.Errorf("all %d id ranges are in use", maxRanges)
}

// freeRange gives a sandbox's range back.
func (l *Local) freeRange(base uint32) {
	if base == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := rangeIndex(l.idBase, base); i >= 0 {
		delete(l.ranges, i)
	}
}

// idMapping maps sandbox ids 0..65535 to host ids base..base+65535.
func idMapping(base uint32) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(base), Size: idMapSize}}
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
