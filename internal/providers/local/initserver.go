package local

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/seccomp"
)

// initServer is a sandbox's init serving the gateway: the control
// protocol (proto.go) and, through package agent, commands and sessions.
// Every command is a child of init, so it inherits init's namespaces and
// cgroups.
type initServer struct {
	cfg initConfig

	// reaper reaps every child of init (commands, and the orphans
	// re-parented to it) and hands a command's status to its waiter.
	reaper *agent.Reaper

	forks chan forkReq
	// forkerTid is the forker thread's id in the sandbox's pid namespace:
	// the gateway moves that thread alone into the sandbox's pids cgroup.
	forkerTid int
}

type forkReq struct {
	fn    func() // run on the forker thread instead of a fork
	argv0 string
	argv  []string
	attr  *syscall.ProcAttr
	res   chan forkRes
}

type forkRes struct {
	pid, pidfd int
	start      time.Time
	wait       <-chan agent.ExitStatus
	err        error
}

func newInitServer(cfg initConfig) *initServer {
	return &initServer{cfg: cfg, forks: make(chan forkReq)}
}

// start starts the reaper and the forker. They live as long as init.
func (a *initServer) start() error {
	a.reaper = agent.NewReaper(false) // init is PID 1: it reaps every orphan anyway
	started := make(chan error, 1)
	go a.forker(started)
	return <-started
}

// onForker runs fn on the forker thread (see forker).
func (a *initServer) onForker(fn func()) {
	res := make(chan forkRes, 1)
	a.forks <- forkReq{fn: fn, res: res}
	<-res
}

// forker performs every fork on one locked OS thread whose capability
// bounding set lacks CAP_SYS_ADMIN and CAP_SYS_PTRACE and which runs under
// the seccomp filter of Docker's default profile. The bounding set and the
// filter are per thread and a child inherits its forking thread's, so
// commands can neither mount nor unmount (e.g. to uncover what a mount
// hides), nor ptrace init, nor make namespaces, nor reach the kernel
// interfaces the profile closes. This works with cgo linked too, where
// AllThreadsSyscall (the whole-process drop) is not supported.
func (a *initServer) forker(started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread is tainted on purpose
	if a.cfg.Isolation == IsolationNamespaces {
		for _, c := range []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE} {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
				started <- fmt.Errorf("drop capability %d: %w", c, err)
				return
			}
		}
		if err := seccomp.Install(); err != nil {
			started <- fmt.Errorf("seccomp filter: %w", err)
			return
		}
	}
	a.forkerTid = unix.Gettid()
	started <- nil
	for r := range a.forks {
		if r.fn != nil {
			r.fn()
			r.res <- forkRes{}
			continue
		}
		r.res <- a.fork(r)
	}
}

func (a *initServer) fork(r forkReq) forkRes {
	pidfd := -1
	r.attr.Sys.PidFD = &pidfd
	var pid int
	wait, err := a.reaper.Start(func() (int, error) {
		var err error
		pid, err = syscall.ForkExec(r.argv0, r.argv, r.attr)
		return pid, err
	}, false)
	if err != nil {
		return forkRes{err: err}
	}
	return forkRes{pid: pid, pidfd: pidfd, start: time.Now(), wait: wait}
}

func (a *initServer) serve(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			fmt.Fprintf(os.Stderr, "sandgate init: accept: %v\n", err)
			continue
		}
		go a.handle(c)
	}
}

func (a *initServer) handle(c *net.UnixConn) {
	defer c.Close()
	var req request
	files, err := recvMsg(c, &req)
	if err != nil {
		closeFiles(files)
		return
	}
	switch req.Op {
	case opExec:
		a.exec(c, req, files)
		return
	case opPing:
		sendMsg(c, reply{Pid: a.forkerTid})
	case opSignal:
		// kill(-1) in init's pid namespace reaches every process of the
		// sandbox but init; without that namespace it would reach the host.
		if a.cfg.Isolation != IsolationNamespaces {
			sendMsg(c, reply{Error: "signal needs a pid namespace", Kind: kindInvalid})
			break
		}
		err := syscall.Kill(-1, syscall.Signal(req.Signal))
		if err != nil && !errors.Is(err, syscall.ESRCH) {
			sendMsg(c, reply{Error: err.Error(), Kind: kindRuntime})
			break
		}
		sendMsg(c, reply{})
	case opKillAll:
		killTree(func(p procInfo) bool { return false }, os.Getpid())
		sendMsg(c, reply{})
	case opOpen:
		a.open(c, req)
	case opStat, opList:
		a.describe(c, req)
	default:
		sendMsg(c, reply{Error: "unknown op " + strconv.Quote(req.Op), Kind: kindInvalid})
	}
	closeFiles(files)
}

// open opens req.Path for the gateway and sends the file back. It runs on
// the forker thread, with exactly a command's privileges (sandbox root, no
// CAP_SYS_ADMIN, the seccomp filter), so the gateway never touches a
// sandbox's path with host credentials.
func (a *initServer) open(c *net.UnixConn, req request) {
	var (
		f   *os.File
		err error
	)
	a.onForker(func() { f, err = openInSandbox(req.Path, req.Write) })
	if err != nil {
		sendMsg(c, fileErrReply(err))
		return
	}
	sendMsg(c, reply{}, f)
	f.Close()
}

// describe describes req.Path (opStat) or lists it (opList) for the
// gateway, on the forker thread as open does: the sandbox's own view,
// permissions and link targets, never the host's.
func (a *initServer) describe(c *net.UnixConn, req request) {
	var (
		rep reply
		err error
	)
	a.onForker(func() {
		if req.Op == opStat {
			var fi providers.FileInfo
			fi, err = statInSandbox(req.Path)
			rep.Entries = []providers.FileInfo{fi}
			return
		}
		rep.Entries, rep.Truncated, err = listInSandbox(req.Path)
	})
	if err != nil {
		rep = fileErrReply(err)
	}
	sendMsg(c, rep)
}

// fileErrReply is the reply for a failed file operation: the system
// error's number when there is one, for the gateway to classify.
func fileErrReply(err error) reply {
	rep := reply{Error: err.Error(), Kind: kindInvalid}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		rep.Errno = int(errno)
	}
	return rep
}

// exec starts one command, reports its pid and pidfd, and reports its
// exit. Kill requests may arrive on the connection meanwhile.
func (a *initServer) exec(c *net.UnixConn, req request, files []*os.File) {
	fail := func(kind string, err error) {
		closeFiles(files)
		sendMsg(c, reply{Error: err.Error(), Kind: kind})
	}
	var master *os.File // TTY: sent back with the pidfd
	if req.TTY {
		if len(files) != 0 {
			fail(kindInvalid, fmt.Errorf("a tty exec takes no descriptors, got %d", len(files)))
			return
		}
		m, slave, err := openPTY(req.Rows, req.Cols)
		if err != nil {
			fail(kindRuntime, err)
			return
		}
		defer m.Close()
		master, files = m, []*os.File{slave, slave, slave}
	}
	if len(files) != 3 {
		fail(kindInvalid, fmt.Errorf("exec needs 3 descriptors, got %d", len(files)))
		return
	}
	u, err := lookupUser(req.User)
	if err != nil {
		fail(kindInvalid, err)
		return
	}
	if fi, err := os.Stat(req.Dir); err != nil || !fi.IsDir() {
		fail(kindInvalid, fmt.Errorf("working directory %s does not exist", req.Dir))
		return
	}
	env := commandEnv(req.Env, u)
	argv := req.Argv
	if req.Command != "" {
		shell := "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			shell = "/bin/bash"
		}
		argv = []string{shell, "-c", req.Command}
	} else if req.Shell && len(argv) == 0 {
		shell := "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			shell = "/bin/bash"
		}
		argv = []string{shell, "-l"}
	}
	if len(argv) == 0 {
		fail(kindInvalid, errors.New("nothing to run"))
		return
	}
	argv0, err := lookPath(argv[0], env)
	if err != nil {
		fail(kindInvalid, err)
		return
	}
	attr := &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   env,
		Files: []uintptr{files[0].Fd(), files[1].Fd(), files[2].Fd()},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,    // own session and process group: the unit that timeouts and cleanup kill
			Setctty:    req.TTY, // the PTY slave (fd 0 in the child) becomes its controlling terminal
			Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups},
		},
	}
	res := make(chan forkRes, 1)
	a.forks <- forkReq{argv0: argv0, argv: argv, attr: attr, res: res}
	r := <-res
	closeFiles(files)
	if r.err != nil {
		sendMsg(c, reply{Error: fmt.Sprintf("start %s: %v", argv[0], r.err), Kind: kindInvalid})
		return
	}
	pidfd := os.NewFile(uintptr(r.pidfd), "pidfd")
	back := []*os.File{pidfd}
	if master != nil {
		back = append(back, master)
	}
	err = sendMsg(c, reply{Pid: r.pid}, back...)
	pidfd.Close()
	if master != nil {
		master.Close() // the gateway holds the only master: when it lets go, the terminal hangs up
	}
	if err != nil {
		// The gateway is gone; the command still runs to completion.
		<-r.wait
		return
	}

	// Kill requests; ends when the connection is closed below.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			var k request
			files, err := recvMsg(c, &k)
			closeFiles(files)
			if err != nil {
				return
			}
			switch k.Op {
			case opKill:
				killSession(r.pid)
			case opSignal:
				signalSession(r.pid, syscall.Signal(k.Signal), k.Foreground)
			}
		}
	}()

	e := <-r.wait
	if !req.Preserve {
		killSession(r.pid)
	}
	cpu := time.Duration(e.Usage.Utime.Nano() + e.Usage.Stime.Nano())
	sendMsg(c, reply{Exited: true, Code: e.Code(),
		Ran: e.At.Sub(r.start), CPU: cpu, MaxRSS: e.Usage.Maxrss << 10})
	c.CloseRead()
	<-done
}

// signalSession sends sig to the process group of the session led by sid
// or, with foreground, to the foreground group of its controlling
// terminal (what a keystroke would signal). It runs in the sandbox's pid
// namespace, so whatever the numbers, only the sandbox's own processes can
// be reached. The leader is a child of init not yet reaped (its waiter is
// pending), so sid still names it.
func signalSession(sid int, sig syscall.Signal, foreground bool) {
	pgrp := sid
	if foreground {
		st, err := readProcStat("/proc", sid)
		if err != nil || st.tpgid <= 0 {
			return
		}
		// The group must belong to the leader's session: a stale number
		// is never signalled.
		if g, err := readProcStat("/proc", st.tpgid); err == nil && g.sid != sid {
			return
		}
		pgrp = st.tpgid
	}
	syscall.Kill(-pgrp, sig)
}

// killSession SIGKILLs what a command (its leader's pid is sid) started:
// its process group, its session, and every descendant of a process in
// them. A process that made its own session and whose parent has already
// exited cannot be told apart from others and survives; only Delete (init's
// death) reaches it.
func killSession(sid int) {
	syscall.Kill(-sid, syscall.SIGKILL)
	killTree(func(p procInfo) bool { return p.sid == sid || p.pgid == sid }, 0)
}

// killTree SIGKILLs every live process that match selects or that descends
// from root (if root > 0) or from a selected process, rescanning until a
// scan finds nothing, so processes forked during the kill are caught too.
func killTree(match func(procInfo) bool, root int) {
	self := os.Getpid()
	for round := 0; round < 50; round++ {
		procs := scanProcs()
		doomed := make(map[int]bool)
		for _, p := range procs {
			if p.pid != self && match(p) {
				doomed[p.pid] = true
			}
		}
		if root > 0 {
			doomed[root] = true
		}
		for grew := true; grew; {
			grew = false
			for _, p := range procs {
				if !doomed[p.pid] && doomed[p.ppid] && p.pid != self {
					doomed[p.pid] = true
					grew = true
				}
			}
		}
		delete(doomed, root)
		delete(doomed, self)
		if len(doomed) == 0 {
			return
		}
		for pid := range doomed {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

type procInfo struct {
	pid, ppid, pgid, sid int
}

// scanProcs lists the live (not zombie) processes in /proc.
func scanProcs() []procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []procInfo
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		st, err := readProcStat("/proc", pid)
		if err != nil || st.state == 'Z' || st.state == 'X' {
			continue
		}
		out = append(out, procInfo{pid: pid, ppid: st.ppid, pgid: st.pgid, sid: st.sid})
	}
	return out
}

// user is a resolved command user.
type user struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
}

// lookupUser resolves a name or numeric uid against the sandbox's
// /etc/passwd and /etc/group; "" is root.
func lookupUser(s string) (user, error) {
	if s == "" {
		s = "0"
	}
	uid, numErr := strconv.ParseUint(s, 10, 32)
	var found *user
	forEachLine("/etc/passwd", func(f []string) bool {
		if len(f) < 7 {
			return true
		}
		id, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			return true
		}
		if (numErr == nil && id == uid) || (numErr != nil && f[0] == s) {
			gid, _ := strconv.ParseUint(f[3], 10, 32)
			found = &user{name: f[0], uid: uint32(id), gid: uint32(gid), home: f[5]}
			return false
		}
		return true
	})
	if found == nil {
		if numErr != nil {
			return user{}, fmt.Errorf("unknown user %q", s)
		}
		// A bare uid with no passwd entry is fine (as in docker exec -u).
		found = &user{uid: uint32(uid), gid: uint32(uid), home: "/"}
	}
	found.groups = []uint32{found.gid}
	if found.name != "" {
		forEachLine("/etc/group", func(f []string) bool {
			if len(f) < 4 {
				return true
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == found.name {
					if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(gid) != found.gid {
						found.groups = append(found.groups, uint32(gid))
					}
				}
			}
			return true
		})
	}
	return *found, nil
}

// forEachLine calls fn with the colon-separated fields of each line of
// path until fn returns false.
func forEachLine(path string, fn func([]string) bool) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return
		}
	}
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// commandEnv is env with PATH, HOME, USER and LOGNAME filled in where env
// does not set them.
func commandEnv(env []string, u user) []string {
	has := make(map[string]bool, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		has[k] = true
	}
	out := make([]string, 0, len(env)+4)
	add := func(k, v string) {
		if !has[k] && v != "" {
			out = append(out, k+"="+v)
		}
	}
	add("PATH", defaultPath)
	add("HOME", u.home)
	add("USER", u.name)
	add("LOGNAME", u.name)
	return append(out, env...)
}

// lookPath finds file in env's PATH, as the shell would.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", file)
}
