package providertest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// The terminal process suite, for providers that start processes
// (providers.ProcessStarter): what a terminal session relies on, from a
// terminal's echo, size and Ctrl-C to a pipe's EOF, signals to the
// process group, kills, and the sandbox going away under a process.

func (s *suite) testProcesses(t *testing.T, ps providers.ProcessStarter, id string) {
	t.Run("TTY", func(t *testing.T) { s.testProcessTTY(t, ps, id) })
	t.Run("PipeStdinEOF", func(t *testing.T) { s.testProcessPipe(t, ps, id) })
	t.Run("PipeSignalGroup", func(t *testing.T) { s.testProcessSignalGroup(t, ps, id) })
	t.Run("Kill", func(t *testing.T) { s.testProcessKill(t, ps, id) })
	t.Run("OwnSIGKILL", func(t *testing.T) { s.testProcessOwnKill(t, ps, id) })
	t.Run("StartErrors", func(t *testing.T) { s.testProcessStartErrors(t, ps, id) })
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// drain copies r into a buffer until EOF (or EIO: a PTY master whose
// slave is gone); the returned func joins the copier.
func drain(r io.Reader) (*syncBuffer, func()) {
	b := &syncBuffer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(b, r)
	}()
	return b, func() { <-done }
}

func waitOutput(t *testing.T, b *syncBuffer, want string) {
	t.Helper()
	eventually(t, fmt.Sprintf("%q in the output", want), func() (bool, string) {
		out := b.String()
		return strings.Contains(out, want), out
	})
}

// running is a shell test that succeeds while a process with exactly the
// command line args runs in the sandbox (portable: no ps needed).
func running(args string) string {
	return `for f in /proc/[0-9]*/cmdline; do [ "$(tr '\0' ' ' < "$f" 2>/dev/null)" = "` + args + ` " ] && echo yes && exit 0; done; echo no`
}

func (s *suite) waitRunning(t *testing.T, id, args string, want bool) {
	t.Helper()
	eventually(t, fmt.Sprintf("%q running=%v", args, want), func() (bool, string) {
		out := s.sh(t, id, running(args))
		return (out == "yes\n") == want, out
	})
}

// testProcessTTY: the interactive shell on a terminal of the asked size,
// TERM set, resize seen by stty, Ctrl-C to the foreground job (the shell
// lives on), and the shell's own exit code.
func (s *suite) testProcessTTY(t *testing.T, ps providers.ProcessStarter, id string) {
	proc, err := ps.StartProcess(ctxT(t, opTimeout), id, providers.ProcessSpec{TTY: true, Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	out, join := drain(proc.Stdout())
	defer join()
	if proc.Stderr() != nil {
		t.Error("Stderr in TTY mode")
	}
	write := func(s string) {
		t.Helper()
		if _, err := io.WriteString(proc.Stdin(), s); err != nil {
			t.Fatal(err)
		}
	}
	write("echo hi-$((1+2)) $TERM\n")
	waitOutput(t, out, "hi-3 "+providers.DefaultTERM)
	write("stty size\n")
	waitOutput(t, out, "30 100")
	if err := proc.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	write("stty size\n")
	waitOutput(t, out, "40 120")

	write("sleep 100\n")
	s.waitRunning(t, id, "sleep 100", true)
	if err := proc.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	write("echo alive-$((2*3)) after-$?\n")
	waitOutput(t, out, "alive-6 after-130")

	write("exit 3\n")
	if code, err := proc.Wait(); err != nil || code != 3 {
		t.Errorf("Wait: %d %v, want 3", code, err)
	}
}

// testProcessPipe: pipes keep stdout and stderr apart, closing stdin is
// EOF, the env reaches the process, and resize is unsupported.
func (s *suite) testProcessPipe(t *testing.T, ps providers.ProcessStarter, id string) {
	proc, err := ps.StartProcess(ctxT(t, opTimeout), id, providers.ProcessSpec{Command: "cat; echo err-$X >&2; exit 5", Env: map[string]string{"X": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	out, joinOut := drain(proc.Stdout())
	errs, joinErr := drain(proc.Stderr())
	io.WriteString(proc.Stdin(), "hello\n")
	proc.Stdin().Close()
	code, err := proc.Wait()
	joinOut()
	joinErr()
	if code != 5 || err != nil || out.String() != "hello\n" || errs.String() != "err-y\n" {
		t.Errorf("exit %d %v stdout %q stderr %q", code, err, out.String(), errs.String())
	}
	if err := proc.Resize(10, 10); !errors.Is(err, providers.ErrUnsupported) {
		t.Errorf("Resize in pipe mode: %v", err)
	}
}

// testProcessSignalGroup: in pipe mode a signal reaches the process's
// whole group, background children included.
func (s *suite) testProcessSignalGroup(t *testing.T, ps providers.ProcessStarter, id string) {
	proc, err := ps.StartProcess(ctxT(t, opTimeout), id, providers.ProcessSpec{Command: "sleep 101 & sleep 102; echo never"})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	out, joinOut := drain(proc.Stdout())
	_, joinErr := drain(proc.Stderr())
	s.waitRunning(t, id, "sleep 102", true)
	s.waitRunning(t, id, "sleep 101", true)
	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, err := proc.Wait()
	joinOut()
	joinErr()
	if code != 143 || err != nil || out.String() != "" {
		t.Errorf("after SIGTERM: exit %d %v stdout %q", code, err, out.String())
	}
	s.waitRunning(t, id, "sleep 101", false)
}

// testProcessKill: Kill returns with nobody reading, is idempotent, and
// the process is gone.
func (s *suite) testProcessKill(t *testing.T, ps providers.ProcessStarter, id string) {
	proc, err := ps.StartProcess(ctxT(t, opTimeout), id, providers.ProcessSpec{Command: "sleep 103"})
	if err != nil {
		t.Fatal(err)
	}
	s.waitRunning(t, id, "sleep 103", true)
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := proc.Kill(); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	if code, err := proc.Wait(); code != 137 || err != nil {
		t.Errorf("Wait after Kill: %d %v", code, err)
	}
	s.waitRunning(t, id, "sleep 103", false)
}

// testProcessOwnKill: a process SIGKILLed in a sandbox that lives on has
// exited with 137; only a sandbox that went away makes it lost.
func (s *suite) testProcessOwnKill(t *testing.T, ps providers.ProcessStarter, id string) {
	proc, err := ps.StartProcess(ctxT(t, opTimeout), id, providers.ProcessSpec{Command: "kill -9 $$"})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	_, joinOut := drain(proc.Stdout())
	_, joinErr := drain(proc.Stderr())
	code, err := proc.Wait()
	joinOut()
	joinErr()
	if code != 137 || err != nil {
		t.Errorf("Wait: %d %v, want 137", code, err)
	}
}

func (s *suite) testProcessStartErrors(t *testing.T, ps providers.ProcessStarter, id string) {
	ctx := ctxT(t, opTimeout)
	if _, err := ps.StartProcess(ctx, id, providers.ProcessSpec{Command: "true", User: "no-such-user"}); !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("unknown user: %v", err)
	}
	if _, err := ps.StartProcess(ctx, id, providers.ProcessSpec{Command: "true", Cwd: "/no/such", TTY: true}); !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("missing cwd (tty): %v", err)
	}
	if _, err := ps.StartProcess(ctx, NewID(), providers.ProcessSpec{}); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
}

// testProcessSandboxRemoved: removing the sandbox under a terminal
// process is the process lost (an error, code -1), not an exit of its own,
// and Wait does not hang.
func (s *suite) testProcessSandboxRemoved(t *testing.T, ps providers.ProcessStarter) {
	id := s.create(t, "/workspace", nil)
	proc, err := ps.StartProcess(ctxT(t, opTimeout), id, providers.ProcessSpec{TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	out, join := drain(proc.Stdout())
	defer join()
	io.WriteString(proc.Stdin(), "echo rea\"\"dy\n")
	waitOutput(t, out, "ready")
	if err := s.p.Delete(ctxT(t, opTimeout), id); err != nil {
		t.Fatal(err)
	}
	type waited struct {
		code int
		err  error
	}
	done := make(chan waited, 1)
	go func() {
		code, err := proc.Wait()
		done <- waited{code, err}
	}()
	var w waited
	eventually(t, "Wait to return after the sandbox was removed", func() (bool, string) {
		select {
		case w = <-done:
			return true, ""
		default:
			return false, "still waiting"
		}
	})
	if w.code != -1 || !(errors.Is(w.err, providers.ErrNotFound) || errors.Is(w.err, providers.ErrConflict)) {
		t.Errorf("Wait after the sandbox was removed: %d %v, want -1 and ErrNotFound or ErrConflict", w.code, w.err)
	}
}
