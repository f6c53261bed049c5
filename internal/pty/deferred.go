package pty

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// deferred is the process of a session created without a mode: it starts
// at the session's first attach, in the mode that attach asks for
// (?pty=0: pipes), as OpenSandbox execd does; its clients pick pipe mode
// on the WebSocket, not in the create body. Until then it stands in for
// the process: the session's readers and owner block on it, and a Kill
// before the start ends them (Wait reports errNeverStarted).
type deferred struct {
	startFn func(ctx context.Context, c sandbox.Caller, tty bool) (providers.Process, error)

	mu    sync.Mutex // serialises start and Kill; guards proc and over
	proc  providers.Process
	over  bool          // killed before it started
	ready chan struct{} // closed once proc is set or over is true
}

var errNeverStarted = errors.New("the session was ended before its first attach")

func newDeferred(start func(ctx context.Context, c sandbox.Caller, tty bool) (providers.Process, error)) *deferred {
	return &deferred{startFn: start, ready: make(chan struct{})}
}

// start starts the process in TTY or pipe mode, for the attaching caller
// c, unless it has started already; it reports whether this call started
// it. A failed start can be tried again by a later attach.
func (d *deferred) start(ctx context.Context, c sandbox.Caller, tty bool) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.proc != nil:
		return false, nil
	case d.over:
		return false, errNeverStarted
	}
	p, err := d.startFn(ctx, c, tty)
	if err != nil {
		return false, err
	}
	d.proc = p
	close(d.ready)
	return true, nil
}

// started waits for the start (or a Kill before it) and returns the
// process, nil if there is none.
func (d *deferred) started() providers.Process {
	<-d.ready
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc
}

// now returns the process if it has started, without waiting.
func (d *deferred) now() providers.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc
}

func (d *deferred) Stdout() io.Reader { return deferredReader{d, false} }
func (d *deferred) Stderr() io.Reader { return deferredReader{d, true} }

// deferredReader reads the started process's stream; EOF if it never
// started, or for stderr in TTY mode.
type deferredReader struct {
	d      *deferred
	stderr bool
}

func (r deferredReader) Read(b []byte) (int, error) {
	p := r.d.started()
	if p == nil {
		return 0, io.EOF
	}
	src := p.Stdout()
	if r.stderr {
		if src = p.Stderr(); src == nil {
			return 0, io.EOF
		}
	}
	return src.Read(b)
}

// Stdin, Resize and Signal act on the started process. A client attaches
// only after the start, so before it they are unreachable but for safety
// refuse.
func (d *deferred) Stdin() io.WriteCloser {
	if p := d.now(); p != nil {
		return p.Stdin()
	}
	return closedStdin{}
}

func (d *deferred) Resize(rows, cols uint16) error {
	if p := d.now(); p != nil {
		return p.Resize(rows, cols)
	}
	return errNeverStarted
}

func (d *deferred) Signal(sig syscall.Signal) error {
	if p := d.now(); p != nil {
		return p.Signal(sig)
	}
	return errNeverStarted
}

func (d *deferred) Wait() (int, error) {
	p := d.started()
	if p == nil {
		return -1, errNeverStarted
	}
	return p.Wait()
}

// Kill kills the started process, or ends the wait of a process that
// never started.
func (d *deferred) Kill() error {
	d.mu.Lock()
	p := d.proc
	if p == nil && !d.over {
		d.over = true
		close(d.ready)
	}
	d.mu.Unlock()
	if p != nil {
		return p.Kill()
	}
	return nil
}

type closedStdin struct{}

func (closedStdin) Write([]byte) (int, error) { return 0, errNeverStarted }
func (closedStdin) Close() error              { return nil }

var _ providers.Process = (*deferred)(nil)
