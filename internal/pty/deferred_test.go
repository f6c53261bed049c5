package pty

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// stubProcess is a finished process with fixed output: the point here is
// what deferred does around it.
type stubProcess struct {
	tty         bool
	out, errOut io.Reader
	killed      atomic.Bool
}

func newStub(tty bool) *stubProcess {
	return &stubProcess{tty: tty, out: strings.NewReader("out"), errOut: strings.NewReader("err")}
}

func (p *stubProcess) Stdout() io.Reader { return p.out }
func (p *stubProcess) Stderr() io.Reader {
	if p.tty {
		return nil
	}
	return p.errOut
}
func (p *stubProcess) Stdin() io.WriteCloser       { return nil }
func (p *stubProcess) Resize(uint16, uint16) error { return nil }
func (p *stubProcess) Signal(syscall.Signal) error { return nil }
func (p *stubProcess) Wait() (int, error)          { return 7, nil }
func (p *stubProcess) Kill() error                 { p.killed.Store(true); return nil }

// TestDeferredStartsOnce: the first start picks the mode and later ones
// change nothing; the streams and the exit are the started process's.
func TestDeferredStartsOnce(t *testing.T) {
	var starts atomic.Int32
	var proc *stubProcess
	d := newDeferred(func(ctx context.Context, c sandbox.Caller, tty bool) (providers.Process, error) {
		starts.Add(1)
		proc = newStub(tty)
		return proc, nil
	})
	if ok, err := d.start(context.Background(), sandbox.Caller{}, false); !ok || err != nil {
		t.Fatalf("first start: %v %v", ok, err)
	}
	if ok, err := d.start(context.Background(), sandbox.Caller{}, true); ok || err != nil || starts.Load() != 1 {
		t.Fatalf("second start: %v %v (%d starts)", ok, err, starts.Load())
	}
	out, _ := io.ReadAll(d.Stdout())
	errOut, _ := io.ReadAll(d.Stderr())
	if string(out) != "out" || string(errOut) != "err" {
		t.Fatalf("streams %q %q", out, errOut)
	}
	if code, err := d.Wait(); code != 7 || err != nil {
		t.Fatalf("wait: %d %v", code, err)
	}
	d.Kill()
	if !proc.killed.Load() {
		t.Fatal("Kill did not reach the started process")
	}
}

// TestDeferredKilledBeforeStart: a session ended before its first attach
// ends its readers and owner, and never starts.
func TestDeferredKilledBeforeStart(t *testing.T) {
	d := newDeferred(func(ctx context.Context, c sandbox.Caller, tty bool) (providers.Process, error) {
		t.Error("started after Kill")
		return nil, errors.New("no")
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		if n, err := d.Stdout().Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Errorf("read: %d %v", n, err)
		}
	}()
	d.Kill()
	<-done
	if _, err := d.Wait(); !errors.Is(err, errNeverStarted) {
		t.Fatalf("wait: %v", err)
	}
	if _, err := d.start(context.Background(), sandbox.Caller{}, true); !errors.Is(err, errNeverStarted) {
		t.Fatalf("start after kill: %v", err)
	}
}

// TestDeferredFailedStartCanRetry: a start that fails (the sandbox was
// paused, say) leaves the session waiting for the next attach.
func TestDeferredFailedStartCanRetry(t *testing.T) {
	fail := true
	d := newDeferred(func(ctx context.Context, c sandbox.Caller, tty bool) (providers.Process, error) {
		if fail {
			return nil, providers.Errorf(providers.ErrConflict, "paused")
		}
		return newStub(tty), nil
	})
	if _, err := d.start(context.Background(), sandbox.Caller{}, true); !errors.Is(err, providers.ErrConflict) {
		t.Fatalf("failing start: %v", err)
	}
	fail = false
	if ok, err := d.start(context.Background(), sandbox.Caller{}, true); !ok || err != nil {
		t.Fatalf("retry: %v %v", ok, err)
	}
	if e, _ := io.ReadAll(d.Stderr()); len(e) != 0 {
		t.Fatalf("stderr of a TTY process: %q", e)
	}
}
