// Package seccomp confines a sandbox's commands with Docker's default
// seccomp profile, in pure Go (no libseccomp, no cgo).
//
// The profile is read at Install time from github.com/moby/profiles/seccomp
// (Docker's own DefaultProfile, so it stays in step with Docker when that
// module is bumped), resolved for this host's kernel and for the
// capabilities Docker gives a container by default, and compiled here to
// BPF with golang.org/x/net/bpf, using the syscall tables of
// github.com/elastic/go-seccomp-bpf/arch. (That module's own compiler is
// not used: v1.6.0 does not reload the syscall number after checking a
// syscall's arguments, so a later syscall's number can match an argument;
// socket(0x38<<32|AF_VSOCK) would pass as clone.) For a command that means,
// as under `docker run`:
//   - any syscall the profile does not allow fails with EPERM;
//   - clone with a namespace flag (CLONE_NEWUSER, NEWNS, NEWPID, NEWNET,
//     NEWUTS, NEWIPC, NEWCGROUP) fails with EPERM, and clone3 with ENOSYS so
//     that glibc falls back to clone;
//   - unshare, setns, mount, umount2, pivot_root, the new mount API, keyctl,
//     add_key, request_key, bpf, perf_event_open, kexec_*, *_module, reboot,
//     open_by_handle_at, userfaultfd, quotactl, syslog, acct, swapon,
//     settimeofday and clock_settime, iopl and ioperm fail with EPERM;
//   - personality is allowed only for the five personas Docker allows, and
//     socket only for Docker's address families (not AF_VSOCK or AF_ALG);
//   - ptrace, process_vm_readv and process_vm_writev are allowed, as Docker
//     allows them on kernels from 4.8 (where ptrace can no longer be used to
//     slip past seccomp); without CAP_SYS_PTRACE they reach only processes
//     of the same user that are dumpable;
//   - chroot is allowed, as for a container with Docker's default
//     CAP_SYS_CHROOT.
//
// Where it differs from Docker, deliberately:
//   - Only the native ABI: Docker's profile also allows the i386 and x32
//     ABIs on x86_64. Here a syscall made through int 0x80 fails with EPERM
//     and an x32 syscall with ENOSYS, so 32-bit binaries do not run.
//   - A syscall numbered above the highest the profile names fails with
//     ENOSYS, not EPERM. This is runc's doing rather than the profile's, so
//     it matches what a Docker container sees, and lets a libc fall back
//     from a syscall newer than the profile.
package seccomp

import (
	"encoding/binary"
	"fmt"

	"github.com/sandgate/sandgate/internal/seccomp/load"
	"golang.org/x/net/bpf"
)

// Install installs the filter on the calling OS thread only (seccomp
// without SECCOMP_FILTER_FLAG_TSYNC). It then applies to that thread and to
// every process forked from it afterwards, across execve, but never to the
// process's other threads. A filter cannot be removed.
//
// The caller must have called runtime.LockOSThread and must never unlock:
// an unlocked filtered thread would go back to the scheduler and run any
// goroutine under the filter. While it stays locked the filter spreads no
// further: the Go runtime never clones a new thread from a locked one (it
// asks an untainted thread to), and the thread ends with its goroutine.
// Forks from that thread must use clone, not clone3: a SysProcAttr with
// UseCgroupFD or CLONE_NEWTIME makes syscall.ForkExec use clone3, which
// fails with ENOSYS; Cloneflags with a namespace flag fail with EPERM.
//
// The kernel takes a filter without no_new_privs from a thread with
// CAP_SYS_ADMIN in the effective set of its user namespace (the bounding
// set does not matter), and Install tries that first, since no_new_privs
// would stop setuid binaries such as sudo and ping from gaining privilege
// in every command. Only if the kernel refuses with EACCES does Install set
// no_new_privs on the thread, for good, and try again; every command then
// runs with no_new_privs, as under `docker run --security-opt
// no-new-privileges`.
//
// The error wraps the kernel's errno: EACCES (refused even with
// no_new_privs), EINVAL (a kernel without seccomp filters), ENOMEM. It is
// also an error to Install on an architecture without a syscall table, or
// if the profile has changed in a way this package cannot compile; the
// tests catch the latter when the profile's module is bumped.
func Install() error {
	prog, err := Compile()
	if err != nil {
		return err
	}
	return load.Install(prog)
}

// Compile compiles the default profile for this host and architecture to
// the program load.Install takes.
func Compile() ([]byte, error) {
	prog, err := build()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("seccomp: assemble: %w", err)
	}
	out := make([]byte, 0, len(raw)*load.InstructionSize)
	for _, r := range raw {
		out = binary.LittleEndian.AppendUint16(out, r.Op)
		out = append(out, r.Jt, r.Jf)
		out = binary.LittleEndian.AppendUint32(out, r.K)
	}
	return out, nil
}

// build compiles the default profile for this host and architecture.
func build() ([]bpf.Instruction, error) {
	p, err := profile()
	if err != nil {
		return nil, fmt.Errorf("resolve profile: %w", err)
	}
	info, err := nativeArch()
	if err != nil {
		return nil, err
	}
	return program(p, info)
}
