package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	sgagent "github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
)

// Terminal sessions live in the sandbox's init, which serves package
// agent's protocol on a second socket in the sandbox's directory
// (sessions.sock, bound by the gateway like agent.sock): init holds each
// session's process, terminal or pipes, retained output and exit status,
// so the sessions outlive the gateway as the sandbox does.

var _ sgagent.Provider = (*Local)(nil)

// serveSessions runs init's session host until the listener closes.
func (a *agent) serveSessions(l net.Listener) {
	srv := sgagent.NewHost(a.startSession)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			fmt.Fprintf(os.Stderr, "sandgate init: sessions: accept: %v\n", err)
			continue
		}
		go srv.Serve(c, nil)
	}
}

// startSession starts a terminal session's process as a child of init
// (forked on the forker thread, like every command), in its own session,
// init holding its PTY master or pipes.
func (a *agent) startSession(_ context.Context, spec providers.ProcessSpec) (providers.Process, error) {
	if err := validateEnv(spec.Env); err != nil {
		return nil, providers.Errorf(providers.ErrInvalid, "%v", err)
	}
	if strings.ContainsRune(spec.Command, 0) {
		return nil, providers.Errorf(providers.ErrInvalid, "command contains a NUL byte")
	}
	env := map[string]string{}
	if spec.TTY {
		env["TERM"] = providers.DefaultTERM
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	u, err := lookupUser(spec.User)
	if err != nil {
		return nil, providers.Errorf(providers.ErrInvalid, "%v", err)
	}
	dir := spec.Cwd
	if dir == "" {
		dir = a.cfg.Workdir
	}
	if !filepath.IsAbs(dir) {
		return nil, providers.Errorf(providers.ErrInvalid, "cwd must be absolute")
	}
	if a.cfg.Isolation == IsolationNone {
		dir = a.cfg.Dir + "/fs" + filepath.Clean(dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, providers.Errorf(providers.ErrInvalid, "working directory %s does not exist", spec.Cwd)
	}
	envs := commandEnv(envList(a.cfg.Env, env), u)
	shell := "/bin/sh"
	if _, err := os.Stat("/bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	argv := []string{shell, "-c", spec.Command}
	if spec.Command == "" {
		argv = []string{shell, "-l"}
	}

	p := &initProcess{stdio: stdio{tty: spec.TTY}, done: make(chan struct{})}
	var child []*os.File
	if spec.TTY {
		m, slave, err := openPTY(cmp(spec.Rows, 24), cmp(spec.Cols, 80))
		if err != nil {
			return nil, err
		}
		p.master, child = m, []*os.File{slave, slave, slave}
	} else {
		var ends [6]*os.File
		for i := 0; i < 6; i += 2 {
			if ends[i], ends[i+1], err = os.Pipe(); err != nil {
				closeFiles(ends[:i])
				return nil, err
			}
		}
		for _, r := range []*os.File{ends[2], ends[4]} {
			unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, pipeSize) // fewer, larger reads
		}
		p.stdin, p.stdout, p.stderr = ends[1], ends[2], ends[4]
		child = []*os.File{ends[0], ends[3], ends[5]}
	}
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   envs,
		Files: []uintptr{child[0].Fd(), child[1].Fd(), child[2].Fd()},
		Sys: &syscall.SysProcAttr{
			Setsid:     true,
			Setctty:    spec.TTY,
			Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups},
		},
	}
	res := make(chan forkRes, 1)
	a.forks <- forkReq{argv0: argv[0], argv: argv, attr: attr, res: res}
	r := <-res
	closeFiles(child)
	if r.err != nil {
		p.close()
		return nil, providers.Errorf(providers.ErrInvalid, "start %s: %v", argv[0], r.err)
	}
	syscall.Close(r.pidfd)
	p.pid = r.pid
	go func() {
		e := <-r.wait
		p.code = exitCode(e.status)
		close(p.done)
	}()
	return p, nil
}

// initProcess is a session's process as init holds it.
type initProcess struct {
	stdio
	pid int // in the sandbox's pid namespace; init's child until reaped

	done     chan struct{} // closed when init has reaped it; code is set
	code     int
	killOnce sync.Once
}

func (p *initProcess) Resize(rows, cols uint16) error {
	if !p.tty {
		return providers.Errorf(providers.ErrUnsupported, "resize needs a terminal")
	}
	return pty.Setsize(p.master, &pty.Winsize{Rows: rows, Cols: cols})
}

// Signal delivers sig inside the sandbox's pid namespace: to the
// terminal's foreground group (TTY) or the process's group.
func (p *initProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return providers.Errorf(providers.ErrConflict, "the process has exited")
	default:
	}
	signalSession(p.pid, sig, p.tty)
	return nil
}

func (p *initProcess) Wait() (int, error) {
	<-p.done
	return p.code, nil
}

// Kill kills the process's session, group and descendants (while it is
// not reaped its pid still names it), and closes its terminal or pipes.
func (p *initProcess) Kill() error {
	p.killOnce.Do(func() {
		select {
		case <-p.done:
		default:
			killSession(p.pid)
		}
		p.close()
	})
	return nil
}

// Agent returns the gateway's connection to sandbox id's session host,
// its init, connecting when there is none or it broke.
func (l *Local) Agent(ctx context.Context, id string) (*sgagent.Client, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, err
	}
	sb.hostMu.Lock()
	defer sb.hostMu.Unlock()
	if c := sb.host; c != nil {
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	conn, err := sb.dialSessions(ctx)
	if err != nil {
		if s := sb.state(); s != providers.StateRunning {
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, s)
		}
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": its session host does not answer")
	}
	// Each attachment gets a connection of its own: output and keystrokes
	// skip the multiplexer.
	c, err := sgagent.Dial(ctx, conn, sgagent.WithDirect(func(ctx context.Context) (net.Conn, error) { return sb.dialSessions(ctx) }))
	if err != nil {
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": its session host")
	}
	sb.host = c
	return c, nil
}

// dialSessions connects to init's session host.
func (sb *sandbox) dialSessions(ctx context.Context) (net.Conn, error) {
	addr, d, err := sockAddrOf(sb.dir, sessionsSocket)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	var dialer net.Dialer
	return dialer.DialContext(ctx, "unix", addr)
}

// dropHost closes the gateway's connection to sb's session host.
func (sb *sandbox) dropHost() {
	sb.hostMu.Lock()
	c := sb.host
	sb.host = nil
	sb.hostMu.Unlock()
	if c != nil {
		c.Close()
	}
}
