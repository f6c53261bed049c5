package agent

import (
	"context"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

var procSeq atomic.Int64

// process is a terminal session's process, started with os/exec in its
// own session and process group, with default signal dispositions. Its
// methods are safe for concurrent use. Stdout is the PTY master (TTY
// mode) or the stdout pipe and reaches EOF (or EIO, read as EOF) once the
// process and every holder of the terminal or pipe are gone; Stderr is
// nil in TTY mode. Signal reaches the terminal's foreground group (as a
// keystroke would) in TTY mode, the process's group in pipe mode.
type process struct {
	s      *Server
	cmd    *exec.Cmd
	pid    int // cmd.Process.Pid, read without racing its Release
	marker string
	ptmx   *os.File // TTY mode
	stdin  io.WriteCloser
	outR   *os.File
	errR   *os.File // pipe mode

	waited <-chan ExitStatus
	done   chan struct{} // closed when the status came
	code   int

	killOnce sync.Once
}

// startProcess starts spec's command in its own session (with the PTY as
// its controlling terminal in TTY mode). Everything it starts carries a
// marker in its environment, so Kill reaches what left its session.
func (s *Server) startProcess(_ context.Context, spec providers.ProcessSpec) (*process, error) {
	env := map[string]string{}
	if spec.TTY {
		env["TERM"] = providers.DefaultTERM
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	argv, err := shellArgs(spec.Command)
	if err != nil {
		return nil, err
	}
	cmd, err := s.command(argv, spec.User, spec.Cwd, env)
	if err != nil {
		return nil, err
	}
	p := &process{s: s, cmd: cmd, done: make(chan struct{}),
		marker: "SANDGATE_PROC=" + strconv.Itoa(os.Getpid()) + "." + strconv.FormatInt(procSeq.Add(1), 10)}
	cmd.Env = append(cmd.Env, p.marker)
	cmd.SysProcAttr.Setsid = true
	if spec.TTY {
		rows, cols := spec.Rows, spec.Cols
		if rows == 0 {
			rows = 24
		}
		if cols == 0 {
			cols = 80
		}
		cmd.SysProcAttr.Setctty = true
		p.waited, err = s.spawn(cmd, func() error {
			ptmx, err := pty.StartWithAttrs(cmd, &pty.Winsize{Rows: rows, Cols: cols}, cmd.SysProcAttr)
			if err != nil {
				return err
			}
			if p.ptmx, err = pollable(ptmx); err != nil {
				cmd.Process.Kill() // started, but nobody could read it: the reaper takes it
			}
			return err
		}, false)
		if err != nil {
			return nil, startError(err)
		}
		p.stdin, p.outR = p.ptmx, p.ptmx
	} else {
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		outR, errR, err := outputPipes(cmd)
		if err != nil {
			in.Close()
			return nil, err
		}
		p.waited, err = s.spawn(cmd, cmd.Start, false)
		closeChildOutputs(cmd)
		if err != nil {
			in.Close()
			outR.Close()
			errR.Close()
			return nil, startError(err)
		}
		p.stdin, p.outR, p.errR = in, outR, errR
	}
	p.pid = cmd.Process.Pid
	go func() {
		p.code = (<-p.waited).Code()
		cmd.Process.Release()
		close(p.done)
	}()
	return p, nil
}

func (p *process) Stdout() io.Reader { return p.outR }

func (p *process) Stderr() io.Reader {
	if p.errR == nil {
		return nil
	}
	return p.errR
}

func (p *process) Stdin() io.WriteCloser {
	if p.ptmx != nil {
		return ttyIn{p.ptmx}
	}
	return p.stdin
}

// ttyIn is a PTY's input: Close is a no-op (the terminal closes at Kill).
type ttyIn struct{ f *os.File }

func (t ttyIn) Write(b []byte) (int, error) { return t.f.Write(b) }
func (ttyIn) Close() error                  { return nil }

func (p *process) Resize(rows, cols uint16) error {
	if p.ptmx == nil {
		return providers.Errorf(providers.ErrUnsupported, "resize needs a terminal; the session is in pipe mode")
	}
	return control(p.ptmx, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
}

func (p *process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return providers.Errorf(providers.ErrConflict, "the process has exited")
	default:
	}
	g := p.pid
	if p.ptmx != nil {
		control(p.ptmx, func(fd int) error {
			if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err == nil && fg > 0 {
				g = fg
			}
			return nil
		})
	}
	return unix.Kill(-g, sig)
}

func (p *process) Wait() (int, error) {
	<-p.done
	return p.code, nil
}

// Kill kills the process, its group and everything carrying its marker,
// and closes the terminal or pipes.
func (p *process) Kill() error {
	p.killOnce.Do(func() {
		select {
		case <-p.done:
		default:
			p.s.reaper.sweep(p.pid, p.marker)
		}
		p.stdin.Close()
		p.outR.Close()
		if p.errR != nil {
			p.errR.Close()
		}
	})
	return nil
}

// pollable returns the terminal master f as a file of Go's poller, and
// closes f. pty.Start leaves the master blocking, so each read held an
// OS thread, and what it read reached the goroutines that send it on
// only through a wakeup of another thread (the reader's thread kept its
// P while blocked again): a keystroke's echo paid that hand-off. Through
// the poller, the reader parks and its thread runs the sender at once.
// The master must then never be touched through Fd(), which would make
// it blocking again (see control).
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// control runs fn on f's descriptor without Fd(), which would put a
// pollable file back into blocking mode.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// outputPipes gives cmd a pipe each for stdout and stderr and returns their
// read ends; after the start, closeChildOutputs closes the write ends the
// child now holds.
func outputPipes(cmd *exec.Cmd) (outR, errR *os.File, err error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, nil, err
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	return outR, errR, nil
}

// closeChildOutputs closes this side's copies of the write ends outputPipes
// gave cmd, so the read ends see EOF when the child's copies close.
func closeChildOutputs(cmd *exec.Cmd) {
	cmd.Stdout.(*os.File).Close()
	cmd.Stderr.(*os.File).Close()
}
