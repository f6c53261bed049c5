package docker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/sandgate/sandgate/internal/providers"
)

// procWrapper starts a terminal session's process: it writes a start
// marker with its pid (the first bytes of its stdout, which the provider
// strips) and then replaces itself with the shell, so that pid is the
// session's process, session leader and process group.
const procWrapper = `printf '<<sandgate:%s:%d;' "$1" "$$"
if [ -x /bin/bash ]; then s=/bin/bash; else s=/bin/sh; fi
if [ -z "$2" ]; then exec "$s" -l; fi
exec "$s" -c "$2"`

// procSignal sends signal $2 to the foreground process group of the
// terminal of session $1 (field tpgid of /proc/$1/stat), falling back to
// the group $1; with $3 = group, always to the group $1.
const procSignal = `w=$1 n=$2 m=$3
g=$w
if [ "$m" != group ] && read -r l < /proc/$w/stat; then
  set -- ${l##*") "}
  [ "${6:--1}" -gt 0 ] 2>/dev/null && g=$6
fi
kill -$n -$g`

// procKill SIGKILLs every process of session $1 (job-control shells put
// foreground jobs in groups of their own) and the group $1.
const procKill = `w=$1
for d in /proc/[0-9]*; do
  read -r l < $d/stat 2>/dev/null || continue
  set -- ${l##*") "}
  [ "$4" = "$w" ] && kill -9 ${d#/proc/} 2>/dev/null
done
kill -9 -$w 2>/dev/null
true`

// helperTimeout bounds the execs that signal, resize or kill a process.
const helperTimeout = 10 * time.Second

// StartProcess starts spec as an exec (with a TTY when spec.TTY) and
// returns once it runs. ctx bounds only the start. ErrInvalid for an
// unknown user or missing cwd, ErrConflict if the sandbox is paused or
// stopped. The Process's Stdout (and Stderr in pipe mode) must be drained:
// the output is not buffered beyond the pipes.
func (d *Docker) StartProcess(ctx context.Context, id string, spec providers.ProcessSpec) (providers.Process, error) {
	env := map[string]string{}
	if spec.TTY {
		env["TERM"] = providers.DefaultTERM
	}
	for k, v := range spec.Env {
		env[k] = v
	}
	nonce := newNonce()
	ex, err := d.startExec(ctx, id, execSpec{
		Cmd:        []string{"/bin/sh", "-c", procWrapper, "sandgate-proc", nonce, spec.Command},
		User:       spec.User,
		WorkingDir: spec.Cwd,
		Env:        envList(env),
		Stdin:      true,
		Tty:        spec.TTY,
	})
	if err != nil {
		return nil, err
	}
	p := &process{d: d, sandbox: id, execID: ex.id, hj: ex.hj, tty: spec.TTY, done: make(chan struct{})}

	// The start marker arrives at once; a start failure arrives instead.
	type started struct {
		pid  int
		rest []byte
		err  error
	}
	got := make(chan started, 1)
	go func() {
		var s started
		if spec.TTY {
			s.pid, s.rest, s.err = readMarker(ex.hj.Reader, nonce)
		} else {
			s.pid, s.rest, s.err = readFramedMarker(ex.hj.Reader, nonce)
		}
		got <- s
	}()
	var s started
	select {
	case s = <-got:
	case <-ctx.Done():
		ex.hj.Close()
		<-got
		return nil, fmt.Errorf("start process in %s: %w", id, ctx.Err())
	}
	if s.err != nil {
		ex.hj.Close()
		var se startErr
		if errors.As(s.err, &se) {
			return nil, d.startFailure(ctx, id, se)
		}
		if _, err := d.Status(context.WithoutCancel(ctx), id); err != nil {
			return nil, err
		}
		return nil, providers.Wrap(providers.ErrUnavailable, s.err, "start process in "+id+": no start marker")
	}
	p.pid = s.pid

	if spec.TTY {
		rows, cols := spec.Rows, spec.Cols
		if rows == 0 {
			rows = 24
		}
		if cols == 0 {
			cols = 80
		}
		if err := p.Resize(rows, cols); err != nil {
			d.log.Warn("initial terminal size", "sandbox", id, "err", err)
		}
	}

	p.outR, p.outW = io.Pipe()
	if !spec.TTY {
		p.errR, p.errW = io.Pipe()
	}
	go p.copy(s.rest)
	return p, nil
}

// process is a providers.Process backed by an exec. It owns one goroutine
// (copy), which moves the attach stream into the pipes and, when the
// stream ends, records the exit status and closes done.
type process struct {
	d       *Docker
	sandbox string
	execID  string
	pid     int // in the container's pid namespace
	tty     bool
	hj      types.HijackedResponse

	outR, errR *io.PipeReader
	outW, errW *io.PipeWriter

	done     chan struct{} // closed when copy has returned; code and err are set
	code     int
	err      error
	killing  atomic.Bool // Kill has begun: a SIGKILL status is its doing
	killOnce sync.Once
	killErr  error
}

var _ providers.Process = (*process)(nil)

func (p *process) copy(rest []byte) {
	defer close(p.done)
	var err error
	if len(rest) > 0 {
		_, err = p.outW.Write(rest)
	}
	if err == nil {
		if p.tty {
			_, err = io.Copy(p.outW, p.hj.Reader)
		} else {
			_, err = stdcopy.StdCopy(p.outW, p.errW, p.hj.Reader)
		}
	}
	// However the stream ended (EOF, closed by Kill, daemon gone), the
	// readers see EOF and the status comes from the daemon.
	p.outW.Close()
	if p.errW != nil {
		p.errW.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	p.code, _, p.err = p.d.exitCode(ctx, p.execID)
	if p.err != nil && err != nil {
		p.err = fmt.Errorf("%w (stream: %v)", p.err, err)
	}
	// A container that is killed or removed SIGKILLs its execs: that is
	// the sandbox gone, not an exit of the process's own (the local
	// provider loses its processes with the sandbox the same way). Kill
	// SIGKILLs too, but then the caller knows why.
	if p.err == nil && p.code == 128+int(syscall.SIGKILL) && !p.killing.Load() {
		if gone := p.d.stopped(ctx, p.sandbox, stopSettle, "the process"); gone != nil {
			p.code, p.err = -1, gone
		}
	}
}

func (p *process) Stdout() io.Reader { return p.outR }

func (p *process) Stderr() io.Reader {
	if p.errR == nil {
		return nil
	}
	return p.errR
}

func (p *process) Stdin() io.WriteCloser { return stdin{p} }

// stdin writes to the attach connection. Close half-closes it in pipe
// mode (EOF to the process); in TTY mode it does nothing.
type stdin struct{ p *process }

func (s stdin) Write(b []byte) (int, error) { return s.p.hj.Conn.Write(b) }

func (s stdin) Close() error {
	if s.p.tty {
		return nil
	}
	return s.p.hj.CloseWrite()
}

// Resize sets the terminal size through exec-resize.
func (p *process) Resize(rows, cols uint16) error {
	if !p.tty {
		return providers.Errorf(providers.ErrUnsupported, "resize needs a terminal")
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	if err := p.d.cli.ContainerExecResize(ctx, p.execID, container.ResizeOptions{Height: uint(rows), Width: uint(cols)}); err != nil {
		return p.d.kind(err, "resize terminal in %s", p.sandbox)
	}
	return nil
}

// Signal delivers sig through a helper exec: in TTY mode to the
// terminal's foreground process group, in pipe mode to the process's
// group. It blocks for one exec round trip. The pid is one in the
// container's pid namespace and is only ever signalled from inside the
// container: nothing on the host is signalled by pid.
func (p *process) Signal(sig syscall.Signal) error {
	mode := "fg"
	if !p.tty {
		mode = "group"
	}
	return p.helper([]string{"/bin/sh", "-c", procSignal, "sandgate-signal", strconv.Itoa(p.pid), strconv.Itoa(int(sig)), mode}, "signal")
}

func (p *process) helper(cmd []string, what string) error {
	select {
	case <-p.done:
		return providers.Errorf(providers.ErrConflict, "process has exited")
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
	defer cancel()
	out, code, err := p.d.run(ctx, p.sandbox, execSpec{Cmd: cmd})
	if err != nil {
		return fmt.Errorf("%s process in %s: %w", what, p.sandbox, err)
	}
	if code != 0 {
		return providers.Wrap(providers.ErrConflict, errors.New(string(bytes.TrimSpace(out))), what+": process is gone")
	}
	return nil
}

// Wait blocks until the attach stream has ended (the process and every
// holder of its terminal or pipes are gone) and returns the exit status
// the daemon recorded (128+N when killed by signal N). When the sandbox
// stopped or was removed under the process there is no exit status of its
// own: -1 and ErrConflict (or ErrNotFound, or ErrUnavailable when the
// daemon cannot say).
func (p *process) Wait() (int, error) {
	<-p.done
	return p.code, p.err
}

// Kill SIGKILLs the process's session and group, closes the connection
// and the pipes (readers see EOF), and waits for the copy goroutine. It is
// idempotent.
func (p *process) Kill() error {
	p.killOnce.Do(func() {
		p.killing.Store(true)
		select {
		case <-p.done:
		default:
			ctx, cancel := context.WithTimeout(context.Background(), helperTimeout)
			_, _, err := p.d.run(ctx, p.sandbox, execSpec{Cmd: []string{"/bin/sh", "-c", procKill, "sandgate-kill", strconv.Itoa(p.pid)}})
			cancel()
			if err != nil && providers.Kind(err) != providers.ErrConflict && providers.Kind(err) != providers.ErrNotFound {
				p.killErr = err
			}
		}
		p.hj.Close()
		// A consumer that stopped reading must not keep copy blocked.
		p.outR.CloseWithError(io.EOF)
		if p.errR != nil {
			p.errR.CloseWithError(io.EOF)
		}
		<-p.done
	})
	return p.killErr
}

// startErr is the daemon's reason an exec did not start, found in place
// of the start marker.
type startErr string

func (e startErr) Error() string { return string(e) }

// readMarker reads the start marker from the head of a raw (TTY) stream
// and returns the pid and any bytes read past it.
func readMarker(r *bufio.Reader, nonce string) (int, []byte, error) {
	var buf []byte
	for {
		b, err := r.ReadByte()
		if err != nil {
			if len(buf) > 0 {
				return 0, nil, startErr(buf)
			}
			return 0, nil, err
		}
		buf = append(buf, b)
		pid, rest, ok, bad := parseMarker(buf, nonce)
		if ok {
			return pid, rest, nil
		}
		if bad {
			// Not our marker: the daemon's error text; take the rest.
			more, _ := io.ReadAll(io.LimitReader(r, 4096))
			return 0, nil, startErr(append(buf, more...))
		}
	}
}

// readFramedMarker is readMarker for a multiplexed (pipe mode) stream: it
// reads frames until the stdout frames hold the marker. Stderr frames
// before it are dropped; the wrapper writes nothing before the marker.
func readFramedMarker(r *bufio.Reader, nonce string) (int, []byte, error) {
	var buf []byte
	hdr := make([]byte, 8)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return 0, nil, err
		}
		n := binary.BigEndian.Uint32(hdr[4:])
		if n > 1<<16 {
			return 0, nil, fmt.Errorf("oversized frame of %d bytes before the start marker", n)
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return 0, nil, err
		}
		switch hdr[0] {
		case byte(stdcopy.Systemerr):
			return 0, nil, startErr(payload)
		case byte(stdcopy.Stdout):
		default:
			continue
		}
		buf = append(buf, payload...)
		pid, rest, ok, bad := parseMarker(buf, nonce)
		if ok {
			return pid, rest, nil
		}
		if bad {
			return 0, nil, startErr(buf)
		}
	}
}

// parseMarker looks for "<<sandgate:NONCE:PID;" at the start of buf. ok:
// found (rest is what follows); bad: buf cannot be its start.
func parseMarker(buf []byte, nonce string) (pid int, rest []byte, ok, bad bool) {
	tok := "<<sandgate:" + nonce + ":"
	k := min(len(buf), len(tok))
	if string(buf[:k]) != tok[:k] {
		return 0, nil, false, true
	}
	if len(buf) <= len(tok) {
		return 0, nil, false, false
	}
	tail := buf[len(tok):]
	i := bytes.IndexByte(tail, ';')
	if i < 0 {
		return 0, nil, false, len(tail) > 12
	}
	pid, err := strconv.Atoi(string(tail[:i]))
	if err != nil || pid <= 0 {
		return 0, nil, false, true
	}
	return pid, tail[i+1:], true, false
}
