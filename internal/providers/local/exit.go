package local

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// How a sandbox that ended without a Delete reads: init is gone, and the
// sandbox is in state error with init's end as the reason ("init killed
// by signal SIGSEGV", "init exited with status 2"), as a docker sandbox
// whose container died. A sandbox the gateway deletes is forgotten before
// its init is killed, so it never reads error.
//
// Init is not the gateway's child (setup orphans it, so that it outlives
// the gateway), so its wait status is read two ways: from its
// /proc/<pid>/stat while it is a zombie (field 52), and once reaped, from
// a pidfd the provider holds on it from its create or adoption
// (PIDFD_INFO_EXIT, Linux 6.15+). A sandbox whose init ended while no
// gateway held it and has been reaped since cannot say why: it reads
// stopped, as before.

// watch opens the pidfd that keeps init's exit status readable after it
// is reaped (see exitReason). It does nothing if init is gone already or
// the kernel has no pidfds; sb must not be shared yet.
func (sb *sandbox) watch() {
	if !alive(sb.st.Pid, sb.st.StartTime) {
		return
	}
	fd, err := unix.PidfdOpen(sb.st.Pid, 0)
	if err != nil {
		return
	}
	// The pidfd pins the pid: if it is init now, it is init's.
	if !alive(sb.st.Pid, sb.st.StartTime) {
		unix.Close(fd)
		return
	}
	sb.pidfd = os.NewFile(uintptr(fd), "pidfd")
}

// unwatch closes the pidfd.
func (sb *sandbox) unwatch() {
	sb.exitMu.Lock()
	defer sb.exitMu.Unlock()
	if sb.pidfd != nil {
		sb.pidfd.Close()
		sb.pidfd = nil
	}
}

// exitReason says how the sandbox's init ended, or "" if it cannot tell
// (init lives, or its status is lost). Once known, the reason is kept.
func (sb *sandbox) exitReason() string {
	sb.exitMu.Lock()
	defer sb.exitMu.Unlock()
	if sb.exitWhy != "" {
		return sb.exitWhy
	}
	ws, ok := sb.initStatus()
	if !ok {
		return ""
	}
	sb.exitWhy = describeExit(ws, sb.oomKills, sb.memoryLimit)
	return sb.exitWhy
}

// initStatus is init's wait status, if it has exited and the status can
// still be read; sb.exitMu is held.
func (sb *sandbox) initStatus() (syscall.WaitStatus, bool) {
	if sb.st.Pid <= 0 {
		return 0, false
	}
	if ps, err := procfs.ReadStat("/proc", sb.st.Pid); err == nil && ps.StartTime == sb.st.StartTime {
		if !ps.Dead() {
			return 0, false // alive
		}
		if ps.ExitCode >= 0 {
			return syscall.WaitStatus(ps.ExitCode), true
		}
	}
	if sb.pidfd == nil {
		return 0, false
	}
	info := unix.PidfdInfo{Mask: unix.PIDFD_INFO_EXIT}
	if err := unix.IoctlPidfdInfo(int(sb.pidfd.Fd()), &info); err != nil || info.Mask&unix.PIDFD_INFO_EXIT == 0 {
		return 0, false
	}
	return syscall.WaitStatus(info.Exit_code), true
}

// describeExit words init's wait status. oomKills and memLimit are asked
// only for a SIGKILL, the kernel's out-of-memory kill.
func describeExit(ws syscall.WaitStatus, oomKills func() int64, memLimit func() int64) string {
	switch {
	case ws.Signaled():
		why := "init killed by signal " + unix.SignalName(ws.Signal())
		if ws.Signal() == syscall.SIGKILL && oomKills() > 0 {
			why += fmt.Sprintf(" (the sandbox ran out of memory: its limit is %d MiB)", memLimit()>>20)
		}
		return why
	case ws.Exited():
		code := ws.ExitStatus()
		if code > jail.InitSignalExit {
			sig := syscall.Signal(code - jail.InitSignalExit)
			for _, s := range jail.InitFatalSignals {
				if s == sig {
					return "init killed by signal " + unix.SignalName(sig)
				}
			}
		}
		return fmt.Sprintf("init exited with status %d", code)
	}
	return fmt.Sprintf("init ended with wait status %#x", uint32(ws))
}

// StateReason says why sandbox id is in state error: how its init ended,
// or how its agent broke the protocol ("" if it is not in error).
func (l *Local) StateReason(id string) string {
	sb, err := l.lookup(id)
	if err != nil {
		return ""
	}
	if alive(sb.st.Pid, sb.st.StartTime) {
		return sb.hostViolation()
	}
	return sb.exitReason()
}

var _ providers.StateReasoner = (*Local)(nil)
