// Package load installs a compiled seccomp filter on the calling thread.
// It is the half of package seccomp a sandbox's init needs: the gateway
// compiles Docker's profile (package seccomp, which links the profile's
// module) and hands init the program.
package load

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// InstructionSize is one BPF instruction's size in a program's bytes
// (struct sock_filter: code u16, jt u8, jf u8, k u32, little-endian).
const InstructionSize = 8

// Install installs prog (see InstructionSize) on the calling OS thread
// only; package seccomp's Install says what that means for the caller.
// It first tries without no_new_privs and sets it only if the kernel
// refuses with EACCES.
func Install(prog []byte) error {
	if len(prog) == 0 || len(prog)%InstructionSize != 0 || len(prog)/InstructionSize > 0xffff {
		return fmt.Errorf("seccomp: a program of %d bytes is not a filter", len(prog))
	}
	filter := make([]unix.SockFilter, len(prog)/InstructionSize)
	for i := range filter {
		b := prog[i*InstructionSize:]
		filter[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.LittleEndian.Uint32(b[4:])}
	}
	fprog := &unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	err := setFilter(fprog)
	if errors.Is(err, unix.EACCES) {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("seccomp: set no_new_privs: %w", err)
		}
		err = setFilter(fprog)
	}
	if err != nil {
		return fmt.Errorf("seccomp: install filter: %w", err)
	}
	return nil
}

// setFilter installs fprog on the calling thread.
func setFilter(fprog *unix.SockFprog) error {
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(fprog)))
	if errno != 0 {
		return errno
	}
	return nil
}
