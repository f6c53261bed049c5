package seccomp

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == childArg {
		os.Exit(runChild(os.Args[2:]))
	}
	goleak.VerifyTestMain(m)
}

// childArg makes the test binary a child that locks its OS thread, sets it
// up as its flags say, and then, from that thread, either forks and execs
// the command after its flags, as the local provider's forker does, or
// runs a probe. The child's exit code is the command's (128+n for signal
// n); 125 means the setup failed.
const childArg = "seccomp-test-child"

const exitSetup = 125

func runChild(args []string) int {
	fs := flag.NewFlagSet(childArg, flag.ContinueOnError)
	filter := fs.Bool("filter", true, "install the filter")
	dropBounding := fs.Bool("drop-bounding", false, "first drop CAP_SYS_ADMIN and CAP_SYS_PTRACE from the thread's bounding set, as the forker does")
	dropAdmin := fs.Bool("drop-admin", false, "first drop CAP_SYS_ADMIN from the thread's effective set")
	probe := fs.String("probe", "", "instead of a command: syscalls (print each syscallCase's errno) or threads (print how many threads are filtered)")
	if err := fs.Parse(args); err != nil {
		return exitSetup
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child setup:", err)
		return exitSetup
	}

	runtime.LockOSThread() // never unlocked: the thread is filtered
	if *dropBounding {
		for _, c := range []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE} {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
				return fail(fmt.Errorf("drop capability %d from the bounding set: %w", c, err))
			}
		}
	}
	if *dropAdmin {
		if err := dropEffective(unix.CAP_SYS_ADMIN); err != nil {
			return fail(err)
		}
	}
	if *filter {
		if err := Install(); err != nil {
			return fail(err)
		}
	}

	switch *probe {
	case "syscalls":
		cases, err := syscallCases()
		if err != nil {
			return fail(err)
		}
		for i, c := range cases {
			if c.kernel {
				fmt.Printf("%d %d\n", i, c.call())
			}
		}
		return 0
	case "threads":
		filtered, total, err := filteredThreads()
		if err != nil {
			return fail(err)
		}
		fmt.Printf("%d of %d\n", filtered, total)
		return 0
	case "":
		return forkExec(fs.Args())
	}
	return fail(fmt.Errorf("unknown probe %q", *probe))
}

// forkExec runs argv from the calling thread and waits for it. It asks
// for a pidfd, as the local provider does (clone with CLONE_PIDFD).
func forkExec(argv []string) int {
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "child: no command")
		return exitSetup
	}
	pidfd := -1
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{0, 1, 2}, Sys: &syscall.SysProcAttr{PidFD: &pidfd}}
	pid, err := syscall.ForkExec(argv[0], argv, attr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: fork/exec:", err)
		return exitSetup
	}
	defer syscall.Close(pidfd)
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: wait:", err)
		return exitSetup
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// dropEffective clears capability c from the calling thread's effective
// set (capabilities are per thread).
func dropEffective(c uint) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[c/32].Effective &^= 1 << (c % 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// filteredThreads counts this process's threads and those under a seccomp
// filter.
func filteredThreads() (filtered, total int, err error) {
	paths, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		return 0, 0, err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread exited
		}
		total++
		if strings.Contains(string(b), "\nSeccomp:\t2\n") {
			filtered++
		}
	}
	return filtered, total, nil
}

// result is how a child ended.
type result struct {
	stdout, stderr string
	code           int
}

// child runs the test binary as a child (see childArg) with args, in new
// user and mount namespaces where it is root: a mount that the filter
// failed to stop stays in the child's namespace (propagation out of a
// namespace owned by another user namespace is one-way, into it), and it
// needs no privilege on the host. It fails the test if the child could
// not be started or its setup failed.
func child(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{childArg}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	// Under -race a process lingers a second at exit unless told not to.
	cmd.Env = append(os.Environ(), "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := result{stdout: stdout.String(), stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("start child %q: %v", args, err)
	}
	if res.code == exitSetup {
		t.Fatalf("child %q: %s", args, res.stderr)
	}
	return res
}
