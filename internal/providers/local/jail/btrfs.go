package jail

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfs ioctls (linux/btrfs.h); x/sys/unix has none.
const (
	btrfsIocSubvolCreate  = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy   = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocSnapCreateV2  = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	btrfsSubvolRdonly     = 1 << 1
	btrfsPathNameMax      = 4087
	btrfsSubvolNameMax    = 4039
	btrfsVolArgsSize      = 4096
	btrfsVolArgsV2HdrSize = 56
)

type btrfsVolArgs struct {
	Fd   int64
	Name [btrfsPathNameMax + 1]byte
}

type btrfsVolArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [btrfsSubvolNameMax + 1]byte
}

func btrfsIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// btrfsSubvolCreate makes an empty subvolume name in directory dir.
func btrfsSubvolCreate(dir int, name string) error {
	var a btrfsVolArgs
	copy(a.Name[:], name)
	return btrfsIoctl(dir, btrfsIocSubvolCreate, unsafe.Pointer(&a))
}

// BtrfsSubvolDelete deletes subvolume name in directory dir.
func BtrfsSubvolDelete(dir int, name string) error {
	var a btrfsVolArgs
	copy(a.Name[:], name)
	return btrfsIoctl(dir, btrfsIocSnapDestroy, unsafe.Pointer(&a))
}

// BtrfsSnapshot makes name in directory dir a read-only snapshot of the
// subvolume src.
func BtrfsSnapshot(dir, src int, name string) error {
	a := btrfsVolArgsV2{Fd: int64(src), Flags: btrfsSubvolRdonly}
	copy(a.Name[:], name)
	return btrfsIoctl(dir, btrfsIocSnapCreateV2, unsafe.Pointer(&a))
}

var (
	_ [btrfsVolArgsSize - unsafe.Sizeof(btrfsVolArgs{})]byte
	_ [unsafe.Sizeof(btrfsVolArgs{}) - btrfsVolArgsSize]byte
	_ [btrfsVolArgsSize - unsafe.Sizeof(btrfsVolArgsV2{})]byte
	_ [unsafe.Sizeof(btrfsVolArgsV2{}) - btrfsVolArgsSize]byte
	_ [btrfsVolArgsV2HdrSize - unsafe.Offsetof(btrfsVolArgsV2{}.Name)]byte
)
