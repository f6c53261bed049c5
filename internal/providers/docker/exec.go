package docker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/sandgate/sandgate/internal/providers"
)

// The Engine API can start an exec but never signal or kill one, and its
// attach stream stays open as long as anything holds the command's stdout
// (plus two seconds after the exec exits). So every command runs under
// execWrapper, a POSIX sh script that is the exec's main process:
//
//   - runc makes the exec's process a session and process-group leader, so
//     the wrapper's pid W is the group of everything the command starts
//     (a non-interactive shell puts its background jobs in its own group).
//   - The command runs in the foreground (bash -c when /bin/bash exists,
//     else sh -c), so it keeps default signal dispositions: an
//     asynchronous list would start with SIGINT and SIGQUIT ignored.
//   - When it returns, the wrapper writes an end marker carrying the exit
//     status to stdout and to stderr: a per-exec random token, the status
//     and ';'. Everything before the marker in a stream is the command's
//     output; the provider stops reading at the markers and does not wait
//     for leftovers that hold the pipes.
//   - Unless background processes are to be preserved, the wrapper then
//     SIGKILLs its own process group (itself included): the command's
//     leftovers die with it.
//
// A timeout or a cancelled context kills from outside: a second exec finds
// the wrapper by the token in its command line and SIGKILLs the group W.
// A leftover that made its own session (setsid, daemons) escapes both; so
// it would from a process group kill anywhere.
const execWrapper = `t="<<sandgate:$1:"
if [ -x /bin/bash ]; then s=/bin/bash; else s=/bin/sh; fi
"$s" -c "$3"
r=$?
printf '%s%d;' "$t" "$r"
printf '%s%d;' "$t" "$r" >&2
[ "$2" = 1 ] || kill -9 0`

// execKiller SIGKILLs the process group of the wrapper whose command line
// holds the token $1$2 (given in halves so this script never matches
// itself).
const execKiller = `for d in /proc/[0-9]*; do
  if grep -aq -- "$1$2" "$d/cmdline" 2>/dev/null; then kill -9 -"${d#/proc/}" 2>/dev/null; fi
done
true`

// maxArg is Linux's limit on one argument string (MAX_ARG_STRLEN), less
// room for the rest of the wrapper's arguments.
const maxArg = 128<<10 - 1024

// leftoverGrace bounds how long Exec waits, after the end markers, for the
// streams to close (the wrapper's group kill landing) before returning.
const leftoverGrace = time.Second

// killGrace bounds how long Exec waits for the streams after killing a
// timed-out or cancelled command, so that output so far is complete.
const killGrace = 3 * time.Second

// Exec runs req.Command through the wrapper described above and waits for
// it. The exit code comes from the end marker, or, if the wrapper died
// without writing one, from exec-inspect. Errors: ErrNotFound (no such
// sandbox), ErrConflict (paused or stopped, also when the container dies
// during the command), ErrInvalid (unknown user, missing cwd, no /bin/sh),
// ErrUnavailable (daemon unreachable); ctx's error when ctx ends (the
// command's group is killed first).
func (d *Docker) Exec(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	start := time.Now()
	if len(req.Command) > maxArg {
		return providers.ExecResult{}, providers.Errorf(providers.ErrInvalid, "command is %d bytes; the docker provider takes at most %d", len(req.Command), maxArg)
	}
	if req.MaxOutput <= 0 {
		req.MaxOutput = providers.DefaultMaxOutput
	}
	if req.Timeout <= 0 {
		req.Timeout = providers.DefaultExecTimeout
	}
	nonce := newNonce()
	preserve := "0"
	if req.PreserveBackground {
		preserve = "1"
	}
	ex, err := d.startExec(ctx, id, execSpec{
		Cmd:        []string{"/bin/sh", "-c", execWrapper, "sandgate-exec", nonce, preserve, req.Command},
		User:       req.User,
		WorkingDir: req.Cwd,
		Env:        envList(req.Env),
		Stdin:      req.Stdin != nil,
	})
	if err != nil {
		return providers.ExecResult{}, err
	}

	tok := []byte("<<sandgate:" + nonce + ":")
	marked := make(chan struct{}, 2)
	stdout := &capture{max: req.MaxOutput, tok: tok, marked: marked}
	stderr := &capture{max: req.MaxOutput, tok: tok, marked: marked}

	// The reader and the stdin writer end when the connection is closed;
	// every path below closes it and joins them before reading the
	// captures.
	var wg sync.WaitGroup
	readDone := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := stdcopy.StdCopy(stdout, stderr, ex.hj.Reader)
		readDone <- err
	}()
	if req.Stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := ex.hj.Conn.Write(req.Stdin); err == nil {
				ex.hj.CloseWrite()
			}
		}()
	}
	finish := func() {
		ex.hj.Close()
		wg.Wait()
		stdout.flush()
		stderr.flush()
	}
	result := func() providers.ExecResult {
		return providers.ExecResult{
			Stdout:    stdout.buf,
			Stderr:    stderr.buf,
			Truncated: stdout.truncated || stderr.truncated,
			Duration:  time.Since(start),
		}
	}

	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	marks := 0
	for {
		select {
		case <-marked:
			if marks++; marks < 2 {
				continue
			}
			if !req.PreserveBackground {
				// Let the wrapper's group kill land before returning.
				waitFor(readDone, leftoverGrace)
			}
			finish()
			res := result()
			res.ExitCode = stdout.code
			return res, nil

		case rerr := <-readDone:
			finish()
			if stdout.state == stateDone && stderr.state == stateDone {
				res := result()
				res.ExitCode = stdout.code
				return res, nil
			}
			return d.endedWithoutMarker(ctx, id, ex.id, rerr, result)

		case <-timer.C:
			d.killExec(ctx, id, nonce)
			waitFor(readDone, killGrace)
			finish()
			res := result()
			res.ExitCode, res.TimedOut = 125, true
			return res, nil

		case <-ctx.Done():
			d.killExec(ctx, id, nonce)
			finish()
			return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", id, ctx.Err())
		}
	}
}

// endedWithoutMarker decides what a stream that ended before the wrapper's
// end markers means: the exec never started (the daemon said why in the
// stream), the sandbox died, the daemon went away, or the wrapper itself
// was killed (then exec-inspect has the status).
func (d *Docker) endedWithoutMarker(ctx context.Context, id, execID string, rerr error, result func() providers.ExecResult) (providers.ExecResult, error) {
	if rerr != nil && strings.HasPrefix(rerr.Error(), "error from daemon in stream") {
		return providers.ExecResult{}, d.startFailure(ctx, id, rerr)
	}
	code, started, err := d.exitCode(ctx, execID)
	if err != nil {
		if rerr != nil {
			return providers.ExecResult{}, providers.Wrap(providers.ErrUnavailable, rerr, "exec in "+id+": lost the command's output stream")
		}
		return providers.ExecResult{}, err
	}
	// The wrapper died without its marker: the container may have been
	// killed (or the wrapper alone).
	settle := stopSettle
	if !started {
		settle = 0
	}
	if err := d.stopped(ctx, id, settle, "the command"); err != nil {
		return providers.ExecResult{}, err
	}
	if rerr != nil {
		return providers.ExecResult{}, providers.Wrap(providers.ErrUnavailable, rerr, "exec in "+id+": lost the command's output stream")
	}
	res := result()
	if !started {
		return providers.ExecResult{}, d.startFailure(ctx, id, errors.New(string(res.Stdout)+string(res.Stderr)))
	}
	res.ExitCode = code
	return res, nil
}

// stopSettle bounds how long stopped waits for a container that still
// looks alive: when a container is killed, its exec streams close before
// the daemon has marked it exited.
const stopSettle = time.Second

// stopped reports whether sandbox id has stopped (or is being removed),
// as the error a call that was running in it returns: ErrConflict
// "sandbox stopped during <what>", or the inspect's error kind
// (ErrNotFound once removed). It polls for up to settle while the
// container still runs and returns nil if it runs on.
func (d *Docker) stopped(ctx context.Context, id string, settle time.Duration, what string) error {
	deadline := time.Now().Add(settle)
	for {
		info, err := d.cli.ContainerInspect(ctx, id)
		switch {
		case err != nil:
			return d.kind(err, "sandbox %s", id)
		case info.State == nil || !info.State.Running || info.State.Dead || info.State.Status == container.StateRemoving:
			return providers.Errorf(providers.ErrConflict, "sandbox %s stopped during %s", id, what)
		}
		if !time.Now().Before(deadline) {
			return nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sandbox %s: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}

// killExec SIGKILLs the process group of the exec whose wrapper carries
// nonce. It runs on a context of its own: it is what ends a cancelled
// call. Failures are logged: the caller's answer does not change.
func (d *Docker) killExec(ctx context.Context, id, nonce string) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	half := len(nonce) / 2
	_, code, err := d.run(kctx, id, execSpec{Cmd: []string{"/bin/sh", "-c", execKiller, "sandgate-kill", nonce[:half], nonce[half:]}})
	if err != nil || code != 0 {
		d.log.Warn("killing a command's process group", "sandbox", id, "exit", code, "err", err)
	}
}

// waitFor waits up to d for the reader to end. The value is dropped:
// callers only need the reader finished or given up on.
func waitFor(ch <-chan error, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// execSpec is one exec as the provider makes it.
type execSpec struct {
	Cmd        []string
	User       string
	WorkingDir string
	Env        []string
	Stdin      bool
	Tty        bool
}

type startedExec struct {
	id string
	hj types.HijackedResponse
}

// startExec creates and starts an exec with stdout and stderr attached.
func (d *Docker) startExec(ctx context.Context, id string, s execSpec) (startedExec, error) {
	created, err := d.cli.ContainerExecCreate(ctx, id, container.ExecOptions{
		User:         s.User,
		Tty:          s.Tty,
		AttachStdin:  s.Stdin,
		AttachStdout: true,
		AttachStderr: !s.Tty,
		Env:          s.Env,
		WorkingDir:   s.WorkingDir,
		Cmd:          s.Cmd,
		// The escape sequence only applies to TTY stdin; make it one
		// nobody types so ^P stays usable in a shell.
		DetachKeys: detachKeys,
	})
	if err != nil {
		return startedExec{}, d.kind(err, "exec in %s", id)
	}
	hj, err := d.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: s.Tty})
	if err != nil {
		return startedExec{}, d.kind(err, "exec in %s", id)
	}
	return startedExec{id: created.ID, hj: hj}, nil
}

// detachKeys is the TTY detach sequence the daemon watches for: long and
// unlikely, since the daemon holds back a typed prefix of it.
const detachKeys = "ctrl-^,ctrl-],ctrl-^,ctrl-]"

// startFailure is the error for an exec the daemon did not start. A
// reason startError cannot place may mean the container is dying (runc
// fails in many ways then), so the container's state decides: a stopped
// or vanished sandbox is ErrConflict/ErrNotFound, like any call that ran
// into a killed container.
func (d *Docker) startFailure(ctx context.Context, id string, err error) error {
	e := startError(err, id)
	if providers.Kind(e) != providers.ErrUnavailable {
		return e
	}
	if serr := d.stopped(context.WithoutCancel(ctx), id, stopSettle, "the start of a command"); serr != nil {
		return serr
	}
	return e
}

// startError maps the daemon's reason for not starting an exec to a kind
// with a client-safe message.
func startError(err error, id string) error {
	s := err.Error()
	switch {
	case strings.Contains(s, "unable to find user"), strings.Contains(s, "no matching entries in passwd"),
		strings.Contains(s, "unable to find group"), strings.Contains(s, "no users found"):
		return providers.Wrap(providers.ErrInvalid, err, "unknown user")
	case strings.Contains(s, "namespace path"), strings.Contains(s, "unable to create new parent process"),
		strings.Contains(s, "cannot exec in a stopped"):
		// runc found the container's init gone: it is dying or dead.
		return providers.Wrap(providers.ErrConflict, err, "sandbox "+id+" is not running")
	case strings.Contains(s, "chdir to cwd"), strings.Contains(s, "chdir"):
		return providers.Wrap(providers.ErrInvalid, err, "working directory does not exist in the sandbox")
	case strings.Contains(s, "executable file not found"), strings.Contains(s, "no such file or directory"):
		return providers.Wrap(providers.ErrInvalid, err, "sandbox "+id+" has no /bin/sh")
	case strings.Contains(s, "is paused"):
		return providers.Wrap(providers.ErrConflict, err, "sandbox "+id+" is paused")
	case strings.Contains(s, "not running"):
		return providers.Wrap(providers.ErrConflict, err, "sandbox "+id+" is not running")
	}
	return providers.Wrap(providers.ErrUnavailable, err, "exec in "+id+" did not start")
}

// run executes s to completion with stdout and stderr merged (the first
// 64 KiB kept) and returns the output and exit code. For the provider's
// own short helper commands.
func (d *Docker) run(ctx context.Context, id string, s execSpec) ([]byte, int, error) {
	ex, err := d.startExec(ctx, id, s)
	if err != nil {
		return nil, 0, err
	}
	defer ex.hj.Close()
	out := &capped{max: 64 << 10}
	done := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(out, out, ex.hj.Reader)
		done <- err
	}()
	select {
	case err = <-done:
	case <-ctx.Done():
		ex.hj.Close()
		<-done
		return nil, 0, fmt.Errorf("exec in %s: %w", id, ctx.Err())
	}
	if err != nil {
		if strings.HasPrefix(err.Error(), "error from daemon in stream") {
			return nil, 0, d.startFailure(ctx, id, err)
		}
		return nil, 0, providers.Wrap(providers.ErrUnavailable, err, "exec in "+id+": lost the output stream")
	}
	code, started, err := d.exitCode(ctx, ex.id)
	if err == nil && !started {
		return nil, 0, d.startFailure(ctx, id, errors.New(string(out.buf)))
	}
	return out.buf, code, err
}

// exitCode waits (polling, bounded by ctx and 10 s) for the daemon to
// record the exec's exit and returns its status. started is false when
// the process never ran (bad user or cwd, no such program): the daemon
// then reports status 126 and writes its reason to the output stream.
func (d *Docker) exitCode(ctx context.Context, execID string) (code int, started bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	delay := time.Millisecond
	for {
		ins, err := d.cli.ContainerExecInspect(ctx, execID)
		if err != nil {
			return 0, false, d.kind(err, "exec status")
		}
		if !ins.Running {
			return ins.ExitCode, ins.Pid != 0, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, false, providers.Wrap(providers.ErrUnavailable, ctx.Err(), "exec status: the daemon did not report the exit")
		case <-t.C:
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func newNonce() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// capped keeps the first max bytes written and discards the rest.
type capped struct {
	max int
	buf []byte
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// Capture states.
const (
	stateScanning = iota // looking for the end marker
	stateTrailer         // marker seen; reading "<status>;"
	stateDone            // status read; later bytes are ignored
)

// capture is one output stream of an Exec: it keeps the first max bytes
// before the end marker (tok followed by "<status>;"), notes whether more
// came, parses the status, and signals marked once when it has it. It is
// written by one goroutine and read only after that goroutine is joined.
type capture struct {
	max       int
	tok       []byte
	marked    chan<- struct{}
	buf       []byte
	truncated bool
	state     int
	code      int
	pend      []byte // tail of the last write that may begin tok
	scratch   []byte
	trailer   []byte
}

func (c *capture) Write(p []byte) (int, error) {
	n := len(p)
	switch c.state {
	case stateDone:
		return n, nil
	case stateTrailer:
		c.addTrailer(p)
		return n, nil
	}
	if len(c.pend) > 0 {
		// A token starting in pend ends within the next len(tok)-1 bytes.
		k := min(len(p), len(c.tok)-1)
		c.scratch = append(append(c.scratch[:0], c.pend...), p[:k]...)
		if i := bytes.Index(c.scratch, c.tok); i >= 0 {
			c.keep(c.scratch[:i])
			c.pend = c.pend[:0]
			c.state = stateTrailer
			c.addTrailer(c.scratch[i+len(c.tok):])
			c.addTrailer(p[k:])
			return n, nil
		}
		c.keep(c.pend)
		c.pend = c.pend[:0]
	}
	if i := bytes.Index(p, c.tok); i >= 0 {
		c.keep(p[:i])
		c.state = stateTrailer
		c.addTrailer(p[i+len(c.tok):])
		return n, nil
	}
	cut := max(len(p)-(len(c.tok)-1), 0)
	c.keep(p[:cut])
	c.pend = append(c.pend, p[cut:]...)
	return n, nil
}

func (c *capture) keep(b []byte) {
	room := c.max - len(c.buf)
	if len(b) > room {
		b = b[:max(room, 0)]
		c.truncated = true
	}
	c.buf = append(c.buf, b...)
}

func (c *capture) addTrailer(b []byte) {
	if c.state != stateTrailer || len(b) == 0 {
		return
	}
	if i := bytes.IndexByte(b, ';'); i >= 0 {
		c.trailer = append(c.trailer, b[:i]...)
		c.code, _ = strconv.Atoi(string(c.trailer))
		c.state = stateDone
		c.marked <- struct{}{}
		return
	}
	if len(c.trailer) < 16 {
		c.trailer = append(c.trailer, b[:min(len(b), 16)]...)
	}
}

// flush keeps what was held back while looking for the marker; called
// when the stream is over.
func (c *capture) flush() {
	if c.state == stateScanning {
		c.keep(c.pend)
		c.pend = nil
	}
}

var _ io.Writer = (*capture)(nil)
