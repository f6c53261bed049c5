package local

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

var _ providers.ProcessStarter = (*Local)(nil)

// pipeSize is the capacity asked for the output pipes of a pipe-mode
// process: fewer, larger reads (the default is 64 KiB).
const pipeSize = 1 << 20

// StartProcess starts a long-lived process in the sandbox for a terminal
// session, as its own session and process group, with default signal
// dispositions. In TTY mode the agent opens the PTY inside the sandbox
// (so the process sees its own /dev/pts/N) and hands the master back; in
// pipe mode the gateway's three pipes are its stdio. ctx bounds only the
// start. ErrConflict if the sandbox is paused or stopped, ErrInvalid for a
// bad spec or a command that cannot start.
func (l *Local) StartProcess(ctx context.Context, id string, spec providers.ProcessSpec) (providers.Process, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, err
	}
	cwd := spec.Cwd
	if cwd == "" {
		cwd = sb.st.Workdir
	}
	if !filepath.IsAbs(cwd) {
		return nil, providers.Errorf(providers.ErrInvalid, "cwd must be absolute")
	}
	if err := validateEnv(spec.Env); err != nil {
		return nil, providers.Errorf(providers.ErrInvalid, "%v", err)
	}
	if strings.ContainsRune(spec.Command, 0) {
		return nil, providers.Errorf(providers.ErrInvalid, "command contains a NUL byte")
	}
	env := spec.Env
	if spec.TTY {
		if _, ok := env["TERM"]; !ok {
			env = make(map[string]string, len(spec.Env)+1)
			for k, v := range spec.Env {
				env[k] = v
			}
			env["TERM"] = providers.DefaultTERM
		}
	}
	req := request{
		Op:      opExec,
		Command: spec.Command,
		Shell:   spec.Command == "",
		Env:     envList(sb.st.Env, env),
		Dir:     sb.hostPath(filepath.Clean(cwd)),
		User:    spec.User,
		TTY:     spec.TTY,
		Rows:    cmp.Or(spec.Rows, 24),
		Cols:    cmp.Or(spec.Cols, 80),
	}
	p := &process{sb: sb, stdio: stdio{tty: spec.TTY}}
	if err := p.start(ctx, req); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return p, nil
}

// process is a process started by StartProcess. The agent connection
// stays open for its life: kill requests go out on it and the exit
// status comes back on it.
type process struct {
	sb     *sandbox
	conn   *net.UnixConn
	leader *os.File // pidfd of the session leader
	stdio           // pollable

	waitOnce sync.Once
	code     int
	waitErr  error
	exited   chan struct{} // closed once Wait has the exit status

	killOnce sync.Once
}

var _ providers.Process = (*process)(nil)

// start sends the request and reads the agent's first reply (pid, pidfd
// and, in TTY mode, the PTY master).
func (p *process) start(ctx context.Context, req request) (err error) {
	p.exited = make(chan struct{})
	var childFiles []*os.File
	defer func() { closeFiles(childFiles) }()
	defer func() {
		if err != nil {
			closeFiles([]*os.File{p.master, p.stdin, p.stdout, p.stderr})
			if p.conn != nil {
				p.conn.Close()
			}
		}
	}()
	if !p.tty {
		var inR, outW, errW *os.File
		if inR, p.stdin, err = os.Pipe(); err != nil {
			return fmt.Errorf("start process in %s: %w", p.sb.id, err)
		}
		childFiles = append(childFiles, inR)
		if p.stdout, outW, err = os.Pipe(); err != nil {
			return fmt.Errorf("start process in %s: %w", p.sb.id, err)
		}
		childFiles = append(childFiles, outW)
		if p.stderr, errW, err = os.Pipe(); err != nil {
			return fmt.Errorf("start process in %s: %w", p.sb.id, err)
		}
		childFiles = append(childFiles, errW)
		for _, f := range []*os.File{p.stdout, p.stderr} {
			if sc, err := f.SyscallConn(); err == nil {
				sc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize) })
			}
		}
	}
	if p.conn, err = p.sb.dial(ctx); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	stop := context.AfterFunc(ctx, func() { p.conn.SetDeadline(time.Now()) })
	defer stop()
	if err := sendMsg(p.conn, req, childFiles...); err != nil {
		return fmt.Errorf("start process in %s: send to agent: %w", p.sb.id, err)
	}
	closeFiles(childFiles)
	childFiles = nil

	var rep reply
	files, err := recvMsg(p.conn, &rep)
	defer func() { closeFiles(files) }()
	if err != nil {
		return fmt.Errorf("start process in %s: agent: %w", p.sb.id, err)
	}
	if rep.Error != "" {
		msg := p.sb.clientMsg(rep.Error)
		if rep.Kind == kindInvalid {
			return providers.Errorf(providers.ErrInvalid, "%s", msg)
		}
		return fmt.Errorf("start process in %s: %s", p.sb.id, msg)
	}
	want := 1
	if p.tty {
		want = 2
	}
	if rep.Pid <= 0 || len(files) != want {
		return fmt.Errorf("start process in %s: agent sent %d descriptors, want %d", p.sb.id, len(files), want)
	}
	p.leader, files[0] = files[0], nil
	if p.tty {
		if p.master, err = pollable(files[1], "ptmx"); err != nil {
			return fmt.Errorf("start process in %s: %w", p.sb.id, err)
		}
	}
	if !stop() {
		return ctx.Err()
	}
	p.conn.SetDeadline(time.Time{})
	return nil
}

// pollable returns a non-blocking, poller-backed copy of f (a descriptor
// received over SCM_RIGHTS is blocking, and a blocking *os.File cannot be
// unblocked by Close). f stays the caller's to close.
func pollable(f *os.File, name string) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// stdio is a session process's end of its terminal or pipes, as the
// gateway (process) or init (initProcess) holds it.
type stdio struct {
	tty    bool
	master *os.File // TTY mode: the PTY master
	stdin  *os.File // pipe mode: write ends / read ends
	stdout *os.File
	stderr *os.File
}

func (p *stdio) Stdout() io.Reader {
	if p.tty {
		return p.master
	}
	return p.stdout
}

func (p *stdio) Stderr() io.Reader {
	if p.tty {
		return nil
	}
	return p.stderr
}

// Stdin is the PTY master (Close is a no-op: the terminal closes at Kill)
// or the stdin pipe.
func (p *stdio) Stdin() io.WriteCloser {
	if p.tty {
		return nopCloser{p.master}
	}
	return p.stdin
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// control runs fn on the master's descriptor without making it blocking
// (as Fd would).
func (p *process) control(fn func(fd int) error) error {
	sc, err := p.master.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := sc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func (p *process) Resize(rows, cols uint16) error {
	if !p.tty {
		return providers.Errorf(providers.ErrUnsupported, "resize needs a PTY")
	}
	return p.control(func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
}

// Signal has the agent send sig to the terminal's foreground process
// group (TTY mode: what the keyboard would signal) or to the process's
// group (pipe mode). The agent does it inside the sandbox's pid
// namespace: the gateway never signals a process group by number, which
// could name someone else's once the group is gone.
func (p *process) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := sendMsg(p.conn, request{Op: opSignal, Signal: int(sig), Foreground: p.tty}); err != nil {
		return fmt.Errorf("signal: %w", err)
	}
	return nil
}

// Wait reads the agent's exit report. The first caller reads; the others
// wait for it.
func (p *process) Wait() (int, error) {
	p.waitOnce.Do(func() {
		defer close(p.exited)
		defer p.conn.Close()
		for {
			var rep reply
			files, err := recvMsg(p.conn, &rep)
			closeFiles(files)
			if err != nil {
				p.code, p.waitErr = -1, fmt.Errorf("process in %s: agent connection lost: %w", p.sb.id, err)
				if s := p.sb.state(); s != providers.StateRunning {
					// The sandbox went, and the process with it.
					p.waitErr = providers.Errorf(providers.ErrConflict, "sandbox %s is %s", p.sb.id, s)
				}
				return
			}
			if rep.Exited {
				p.code = rep.Code
				return
			}
		}
	})
	return p.code, p.waitErr
}

// Kill has the agent kill the process's group, session and descendants,
// kills the leader from here through its pidfd (which works when the agent
// is stuck), and closes the terminal or pipes, ending their readers.
// Idempotent; the first call does it all.
func (p *process) Kill() error {
	// Once: the pidfd is closed here, and a concurrent Kill must not use
	// it meanwhile.
	p.killOnce.Do(func() {
		select {
		case <-p.exited:
		default:
			sendMsg(p.conn, request{Op: opKill})
			if p.leader != nil {
				unix.PidfdSendSignal(int(p.leader.Fd()), unix.SIGKILL, nil, 0)
			}
		}
		closeFiles([]*os.File{p.master, p.stdin, p.stdout, p.stderr, p.leader})
	})
	return nil
}

// openPTY opens a PTY inside the sandbox (agent side) with the given size.
func openPTY(rows, cols uint16) (master, slave *os.File, err error) {
	master, slave, err = pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open a pty: %w", err)
	}
	if err := pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols}); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, fmt.Errorf("size the pty: %w", err)
	}
	return master, slave, nil
}
