package agent

import (
	"bytes"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// reaper makes the agent the subreaper of everything it starts: a
// process whose parent dies is re-parented to the agent, which reaps it.
// The agent's own children (commands and sessions) are waited for by
// os/exec; reaper only reaps the others, and start registers a child
// under the same lock as the scan, so the two never race for a status.
type reaper struct {
	mu    sync.Mutex
	known map[int]bool
	stop  chan struct{}
	done  chan struct{}
}

// newReaper becomes a subreaper when sub is true and starts reaping.
func newReaper(sub bool) *reaper {
	r := &reaper{known: map[int]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
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

func (r *reaper) close() {
	close(r.stop)
	<-r.done
}

// start starts cmd and registers it as a child os/exec waits for; call
// forget after its Wait.
func (r *reaper) start(cmd *exec.Cmd, start func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := start(); err != nil {
		return err
	}
	r.known[cmd.Process.Pid] = true
	return nil
}

func (r *reaper) forget(pid int) {
	r.mu.Lock()
	delete(r.known, pid)
	r.mu.Unlock()
}

// reap waits for every child the agent did not start itself (orphans
// re-parented to it) that has exited.
func (r *reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, pid := range procTree()[os.Getpid()] {
		if r.known[pid] {
			continue
		}
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
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
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold anything but ')'
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			kids[ppid] = append(kids[ppid], pid)
		}
	}
	return kids
}

// sweep SIGKILLs process group pgid and every process in the sandbox
// that carries marker in its environment (set on a command at its start
// and inherited by everything it starts, also by what leaves its session
// with setsid), with its descendants, repeating until a pass finds
// nothing, so a process that forks during a pass is caught by the next.
//
// Only the agent's own subtrees are searched: the agent is the subreaper
// of what it starts, so a command's surviving descendants are under the
// command itself or under an orphan that was re-parented to the agent. A
// sweep costs a kill and a read of the environment of the agent's
// descendants (usually a handful).
func (r *reaper) sweep(pgid int, marker string) {
	unix.Kill(-pgid, unix.SIGKILL)
	want := []byte(marker + "\x00")
	for pass := 0; pass < 20; pass++ {
		tree := procTree()
		found := false
		var walk func(pid int, doomed bool)
		walk = func(pid int, doomed bool) {
			if !doomed {
				env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
				doomed = err == nil && bytes.Contains(env, want)
			}
			if doomed && unix.Kill(pid, unix.SIGKILL) == nil && !zombie(pid) {
				found = true
			}
			for _, c := range tree[pid] {
				walk(c, doomed)
			}
		}
		for _, pid := range tree[os.Getpid()] {
			walk(pid, false)
		}
		if !found {
			return
		}
	}
}

// zombie reports whether pid has exited and awaits its reaping.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}
