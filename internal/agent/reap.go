package agent

import (
	"bytes"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/procfs"
)

// Reaper is the only waiter for a process's children: one loop reaps
// every child at once and hands the status of a command or session
// process to the channel Start returned; nothing calls exec.Cmd.Wait.
// Made a subreaper (tests, where no init reaps), it also reaps orphans,
// as it does in a local sandbox's init (its PID 1). In a container the
// agent is not one: orphans go to the sandbox's init (docker-init), whose
// reaping keeps up with a fork bomb. It waits for any child, so a process
// has one: a second would take the first's children (tests that start
// processes do not run beside other servers).
type Reaper struct {
	mu       sync.Mutex // held across a start and its registration, and while reaping
	waiters  map[int]waiter
	oomScore OOMScore // see Start
	stop     chan struct{}
	done     chan struct{}
}

// waiter is who wants a child's status, and whether its process group
// dies with it.
type waiter struct {
	ch    chan ExitStatus
	group bool
}

// ExitStatus is how a child ended and what it used (with the children it
// waited for).
type ExitStatus struct {
	Status syscall.WaitStatus
	Usage  syscall.Rusage
	At     time.Time // when it was reaped
}

// Code is the status as an exit code: 128+N when signal N killed it.
func (e ExitStatus) Code() int {
	switch {
	case e.Status.Exited():
		return e.Status.ExitStatus()
	case e.Status.Signaled():
		return 128 + int(e.Status.Signal())
	}
	return 255
}

// NewReaper becomes a subreaper when sub is true and starts reaping
// (until Close).
func NewReaper(sub bool) *Reaper {
	r := &Reaper{waiters: map[int]waiter{}, stop: make(chan struct{}), done: make(chan struct{})}
	if sub {
		unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCHLD)
	go func() {
		defer close(r.done)
		defer signal.Stop(ch)
		for {
			select {
			case <-ch:
				r.reap()
			case <-r.stop:
				return
			}
		}
	}()
	return r
}

// Close stops reaping.
func (r *Reaper) Close() {
	close(r.stop)
	<-r.done
}

// Start forks a child with fork (which returns its pid) and returns the
// channel that gets its exit status. With group, what is left of its
// process group is killed when it exits, before it is reaped. The caller
// must not wait for the child. The child is the OOM killer's first
// choice ahead of this process (see OOMScore).
func (r *Reaper) Start(fork func() (int, error), group bool) (<-chan ExitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.oomScore.Set("1000")
	pid, err := fork()
	r.oomScore.Set("0")
	if err != nil {
		return nil, err
	}
	ch := make(chan ExitStatus, 1)
	r.waiters[pid] = waiter{ch, group}
	return ch, nil
}

// reap reaps every child that has exited. A child whose group dies with
// it is seen first without being reaped: as long as it is a zombie, its
// pid, the group's number, cannot be reused, so the kill reaches its
// group and nothing else. One kill takes a fork bomb's whole group at
// once; a sweep that went process by process would race its forks.
func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		pid := siginfoPid(&info)
		if err != nil || pid <= 0 {
			return
		}
		w, ok := r.waiters[pid]
		if ok && w.group {
			unix.Kill(-pid, unix.SIGKILL)
		}
		var st ExitStatus
		if _, err := syscall.Wait4(pid, &st.Status, syscall.WNOHANG, &st.Usage); err == syscall.EINTR {
			continue
		}
		if ok {
			st.At = time.Now()
			w.ch <- st
			delete(r.waiters, pid)
		}
	}
}

// siginfoPid is si_pid of a SIGCHLD siginfo: the first field of the
// union that follows signo, errno and code, at offset 16 on the 64-bit
// architectures (x/sys leaves it unnamed).
func siginfoPid(info *unix.Siginfo) int {
	return int(*(*int32)(unsafe.Add(unsafe.Pointer(info), 16)))
}

// KillGroup SIGKILLs the process group of pid while pid is a child not
// yet reaped (its group's number is still its own); otherwise it does
// nothing.
func (r *Reaper) KillGroup(pid int) { r.SignalGroup(pid, unix.SIGKILL) }

// SignalGroup sends sig to the process group of pid as KillGroup does.
func (r *Reaper) SignalGroup(pid int, sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiters[pid]; ok {
		unix.Kill(-pid, sig)
	}
}

// OOMScore is this process's own oom_score_adj, opened at its first Set.
// A child inherits the score at its fork: raising it around a fork makes
// the child the OOM killer's first choice ahead of its parent, and
// lowering it again back to 0 needs no privilege. Not safe for concurrent
// use.
type OOMScore struct{ f *os.File }

// Set writes v (best effort: without /proc nothing changes).
func (o *OOMScore) Set(v string) {
	if o.f == nil {
		if o.f, _ = os.OpenFile("/proc/self/oom_score_adj", os.O_WRONLY, 0); o.f == nil {
			return
		}
	}
	o.f.WriteAt([]byte(v), 0)
}

// procTree maps every process in the sandbox's pid namespace to its
// children, from /proc/<pid>/stat. A sandbox holds few processes, and one
// pass over them costs less than reading the children file of every
// thread of the agent.
func procTree() map[int][]int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	kids := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procfs.ReadStat("/proc", pid); err == nil {
			kids[st.PPid] = append(kids[st.PPid], pid)
		}
	}
	return kids
}

// sweep SIGKILLs process group pgid (0: none; see KillGroup) and every process in the sandbox
// that carries marker in its environment (set on a command at its start
// and inherited by everything it starts, also by what leaves its session
// with setsid), with its descendants, repeating until a pass finds
// nothing, so a process that forks during a pass is caught by the next.
// A process caught inside an execve shows no environment yet (see
// marked): the sweep looks again until it shows one, for up to
// execPatience.
//
// The whole sandbox is searched (orphans are re-parented to its init,
// which reaps them): a sweep costs a kill and one read of /proc/<pid>/stat
// and environ per process in the sandbox, usually a handful.
func (r *Reaper) sweep(pgid int, marker string) {
	if pgid > 0 {
		r.KillGroup(pgid)
	}
	want := []byte(marker + "\x00")
	patience := time.Now().Add(execPatience)
	for pass := 0; ; pass++ {
		tree := procTree()
		found, unsure := false, false
		var walk func(pid int, doomed bool)
		walk = func(pid int, doomed bool) {
			if !doomed {
				var unknown bool
				doomed, unknown = marked(pid, want)
				unsure = unsure || unknown
			}
			if doomed && unix.Kill(pid, unix.SIGKILL) == nil && !zombie(pid) {
				found = true
			}
			for _, c := range tree[pid] {
				walk(c, doomed)
			}
		}
		// Every process descends from one whose parent is outside the
		// pid namespace (ppid 0: its init, and what docker exec entered).
		for _, pid := range tree[0] {
			walk(pid, false)
		}
		switch {
		case found && pass < 20:
		case unsure && time.Now().Before(patience):
			time.Sleep(time.Millisecond) // let the execve lay out the new stack
		default:
			return
		}
	}
}

// execPatience bounds how long a sweep waits for a process inside an
// execve to show its environment: an execve takes microseconds, but a
// preempted one on a loaded machine can take many milliseconds.
const execPatience = time.Second

// marked reports whether pid's environment holds want, or that it cannot
// tell yet: a process inside an execve shows an empty environment until
// the kernel has laid out its new stack (procfs.Stat.Execing), and may
// carry the marker into the program it is starting; and an empty read
// beside a stat that shows an environment means the layout ended between
// the two reads.
func marked(pid int, want []byte) (yes, unknown bool) {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false, false
	}
	if len(env) > 0 {
		return bytes.Contains(env, want), false
	}
	st, err := procfs.ReadStat("/proc", pid)
	return false, err == nil && (st.Execing || st.EnvBytes > 0)
}

// zombie reports whether pid has exited and awaits its reaping.
func zombie(pid int) bool {
	st, err := procfs.ReadStat("/proc", pid)
	return err != nil || st.Dead()
}

// killDescendants SIGKILLs every descendant of pid, repeating until a
// pass finds none alive, so a process that forks during a pass is caught
// by the next.
func killDescendants(pid int) {
	for pass := 0; pass < 50; pass++ {
		tree := procTree()
		found := false
		var walk func(p int)
		walk = func(p int) {
			for _, c := range tree[p] {
				if unix.Kill(c, unix.SIGKILL) == nil && !zombie(c) {
					found = true
				}
				walk(c)
			}
		}
		walk(pid)
		if !found {
			return
		}
	}
}
