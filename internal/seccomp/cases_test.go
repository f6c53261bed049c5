package seccomp

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// syscallCase is one syscall and what the filter must do with it.
type syscallCase struct {
	desc string
	arch uint32 // an AUDIT_ARCH_* value; 0 for the native one
	nr   uint32
	args [6]uint64
	want syscall.Errno // 0: allowed; else refused with this errno
	// kernel: the child also makes the call for real. The arguments make
	// the kernel fail it harmlessly with an errno other than want, so a
	// child without the filter tells the filter's refusal from the
	// kernel's, and an allowed call fails the same with and without it.
	kernel bool
}

// call makes the syscall on the calling thread.
func (c syscallCase) call() syscall.Errno {
	a := c.args
	_, _, e := syscall.RawSyscall6(uintptr(c.nr), uintptr(a[0]), uintptr(a[1]), uintptr(a[2]), uintptr(a[3]), uintptr(a[4]), uintptr(a[5]))
	return e
}

const (
	minus1   = ^uint64(0) // an fd, pid or dirfd of -1
	badFlags = 0xffffffff // fails a syscall's flag check, which comes first
	// badType is a socket type with unknown flag bits: socket() fails with
	// EINVAL before it looks at the address family.
	badType = 0x7fff
)

// syscallCases returns the cases for the native architecture; a syscall
// it lacks has none.
func syscallCases() ([]syscallCase, error) {
	info, err := nativeArch()
	if err != nil {
		return nil, err
	}
	p, err := profile()
	if err != nil {
		return nil, err
	}
	rs, err := rules(p, info)
	if err != nil {
		return nil, err
	}
	var out []syscallCase
	add := func(desc, name string, want syscall.Errno, kernel bool, args ...uint64) {
		nr, ok := info.SyscallNames[name]
		if !ok {
			return
		}
		c := syscallCase{desc: desc, nr: uint32(nr), want: want, kernel: kernel}
		copy(c.args[:], args)
		out = append(out, c)
	}
	const allowed = 0
	eperm, enosys := syscall.EPERM, syscall.ENOSYS

	add("getpid", "getpid", allowed, true)
	add("read fd -1", "read", allowed, true, minus1)
	add("clone without a namespace flag", "clone", allowed, true, unix.CLONE_THREAD)
	for _, ns := range []struct {
		name string
		flag uint64
	}{
		{"CLONE_NEWUSER", unix.CLONE_NEWUSER}, {"CLONE_NEWNS", unix.CLONE_NEWNS},
		{"CLONE_NEWPID", unix.CLONE_NEWPID}, {"CLONE_NEWNET", unix.CLONE_NEWNET},
		{"CLONE_NEWUTS", unix.CLONE_NEWUTS}, {"CLONE_NEWIPC", unix.CLONE_NEWIPC},
		{"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP},
	} {
		// CLONE_THREAD without CLONE_SIGHAND: EINVAL if the filter lets
		// it through, so nothing is ever cloned.
		add("clone "+ns.name, "clone", eperm, true, ns.flag|unix.CLONE_THREAD)
	}
	add("clone3, so that glibc falls back to clone", "clone3", enosys, true, 0, 0)

	for _, af := range []struct {
		name string
		af   uint64
	}{
		{"AF_UNIX", unix.AF_UNIX}, {"AF_INET", unix.AF_INET}, {"AF_INET6", unix.AF_INET6},
		{"AF_NETLINK", unix.AF_NETLINK}, {"AF_PACKET", unix.AF_PACKET},
	} {
		add("socket "+af.name, "socket", allowed, true, af.af, badType)
	}
	add("socket AF_VSOCK", "socket", eperm, true, unix.AF_VSOCK, badType)
	add("socket AF_ALG", "socket", eperm, true, unix.AF_ALG, badType)
	add("socket AF_INET with high bits set", "socket", eperm, true, 1<<32|unix.AF_INET, badType)
	// go-seccomp-bpf v1.6.0 lets this one through as clone.
	add("socket AF_VSOCK with clone's number in the high half", "socket", eperm, true,
		uint64(info.SyscallNames["clone"])<<32|unix.AF_VSOCK, badType)

	add("personality query", "personality", allowed, true, 0xffffffff)
	add("personality PER_LINUX", "personality", allowed, true, 0)
	add("personality PER_LINUX32", "personality", allowed, false, 0x8)
	add("personality UNAME26", "personality", allowed, false, 0x20000)
	add("personality PER_LINUX32|UNAME26", "personality", allowed, false, 0x20008)
	add("personality ADDR_NO_RANDOMIZE", "personality", eperm, true, 0x0040000)
	add("personality PER_LINUX32 with high bits set", "personality", eperm, true, 1<<32|0x8)

	// Docker allows these from kernel 4.8; CAP_SYS_PTRACE is still needed
	// to reach another user's or a non-dumpable process.
	add("ptrace", "ptrace", allowed, true, unix.PTRACE_PEEKUSR, minus1)
	add("process_vm_readv", "process_vm_readv", allowed, true, 0, 0, 0, 0, 0, 1)
	add("process_vm_writev", "process_vm_writev", allowed, true, 0, 0, 0, 0, 0, 1)
	// Docker's default capabilities include CAP_SYS_CHROOT.
	add("chroot", "chroot", allowed, true, 0)

	add("unshare", "unshare", eperm, true, unix.CLONE_NEWUSER) // EINVAL in a threaded process
	add("setns", "setns", eperm, true, minus1, 0)
	add("mount", "mount", eperm, true)
	add("umount2", "umount2", eperm, true)
	add("pivot_root", "pivot_root", eperm, true)
	add("fsopen", "fsopen", eperm, true)
	add("open_tree", "open_tree", eperm, true, minus1, 0, badFlags)
	add("move_mount", "move_mount", eperm, true, minus1, 0, minus1, 0, badFlags)
	add("mount_setattr", "mount_setattr", eperm, true, minus1, 0, badFlags)
	add("keyctl", "keyctl", eperm, true, 0x7fffffff)
	add("add_key", "add_key", eperm, true)
	add("request_key", "request_key", eperm, true)
	add("perf_event_open", "perf_event_open", eperm, true, 0, 0, minus1, minus1, badFlags)
	add("userfaultfd", "userfaultfd", eperm, true, badFlags)
	// Without the filter the kernel too says EPERM to these, here: the
	// BPF is checked in the VM only.
	for _, name := range []string{
		"bpf", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"reboot", "open_by_handle_at", "iopl", "ioperm", "settimeofday", "clock_settime",
		"syslog", "acct", "swapon", "swapoff", "quotactl", "vhangup", "lookup_dcookie",
		"fanotify_init", "kcmp", "pidfd_getfd", "process_madvise", "set_mempolicy", "mbind",
	} {
		add(name, name, eperm, false)
	}

	maxNr := rs[len(rs)-1].nr
	out = append(out,
		syscallCase{desc: "the first number past the profile", nr: maxNr + 1, want: enosys, kernel: true,
			args: [6]uint64{minus1, 0, badFlags, 0, 0, 0}},
		syscallCase{desc: "number 1000", nr: 1000, want: enosys},
		syscallCase{desc: "number -1", nr: 0xffffffff, want: enosys},
	)
	if info.ID == unix.AUDIT_ARCH_X86_64 {
		const x32 = 0x40000000
		out = append(out,
			syscallCase{desc: "x32 getpid", nr: x32 | uint32(info.SyscallNames["getpid"]), want: enosys},
			syscallCase{desc: "i386 getpid", arch: unix.AUDIT_ARCH_I386, nr: 20, want: eperm},
			syscallCase{desc: "i386 restart_syscall", arch: unix.AUDIT_ARCH_I386, nr: 0, want: eperm},
		)
	}
	return out, nil
}
