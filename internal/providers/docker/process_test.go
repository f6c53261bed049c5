package docker

import (
	"errors"
	"io"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// drain copies r into a buffer until EOF; the returned wait joins it.
func drain(r io.Reader) (*lockedBuffer, func()) {
	b := &lockedBuffer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(b, r)
	}()
	return b, wg.Wait
}

func waitOutput(t *testing.T, b *lockedBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(b.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the output; have %q", want, b.String())
		}
		tick := time.NewTimer(20 * time.Millisecond)
		<-tick.C
	}
}

func TestStartProcessTTY(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	proc, err := p.StartProcess(ctxFor(t, time.Minute), id, providers.ProcessSpec{TTY: true, Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	out, join := drain(proc.Stdout())
	defer join()
	defer proc.Kill()
	if proc.Stderr() != nil {
		t.Error("Stderr in TTY mode")
	}
	in := proc.Stdin()
	write := func(s string) {
		t.Helper()
		if _, err := io.WriteString(in, s); err != nil {
			t.Fatal(err)
		}
	}
	if strings.HasPrefix(out.String(), "<<sandgate") {
		t.Errorf("start marker leaked: %q", out.String())
	}
	write("echo hi-$((1+2)) $TERM\n")
	waitOutput(t, out, "hi-3 xterm-256color")
	write("stty size\n")
	waitOutput(t, out, "30 100")
	if err := proc.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	write("stty size\n")
	waitOutput(t, out, "40 120")

	// Ctrl-C semantics: SIGINT reaches the foreground job, not the shell.
	write("sleep 100\n")
	eventually(t, "sleep in the foreground", func() bool { return contains(run(t, p, id, "ps -o args").Stdout, "sleep 100") })
	if err := proc.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	write("echo alive-$((2*3)) after-$?\n")
	waitOutput(t, out, "alive-6 after-130")

	write("exit 3\n")
	code, err := proc.Wait()
	if err != nil || code != 3 {
		t.Errorf("Wait: %d %v, want 3", code, err)
	}
}

func TestStartProcessPipe(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxFor(t, time.Minute)

	t.Run("StdinEOF", func(t *testing.T) {
		proc, err := p.StartProcess(ctx, id, providers.ProcessSpec{Command: "cat; echo err-line >&2; exit 5", Env: map[string]string{"X": "y"}})
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
		if code != 5 || err != nil || out.String() != "hello\n" || errs.String() != "err-line\n" {
			t.Errorf("exit %d %v stdout %q stderr %q", code, err, out.String(), errs.String())
		}
		if err := proc.Resize(10, 10); !errors.Is(err, providers.ErrUnsupported) {
			t.Errorf("Resize in pipe mode: %v", err)
		}
	})
	t.Run("SignalGroup", func(t *testing.T) {
		proc, err := p.StartProcess(ctx, id, providers.ProcessSpec{Command: "sleep 101 & sleep 102; echo never"})
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		out, joinOut := drain(proc.Stdout())
		_, joinErr := drain(proc.Stderr())
		eventually(t, "the sleeps", func() bool { return contains(run(t, p, id, "ps -o args").Stdout, "sleep 102") })
		if err := proc.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, err := proc.Wait()
		joinOut()
		joinErr()
		if code != 143 || err != nil || out.String() != "" {
			t.Errorf("after SIGTERM: exit %d %v stdout %q", code, err, out.String())
		}
		// The whole group got it: the background sleep too.
		eventually(t, "the group to be gone", func() bool { return !contains(run(t, p, id, "ps -o args").Stdout, "sleep 10") })
	})
	t.Run("Kill", func(t *testing.T) {
		proc, err := p.StartProcess(ctx, id, providers.ProcessSpec{Command: "sleep 103"})
		if err != nil {
			t.Fatal(err)
		}
		// Nobody reads: Kill must still return and release everything.
		if err := proc.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := proc.Kill(); err != nil {
			t.Errorf("second Kill: %v", err)
		}
		if code, err := proc.Wait(); code != 137 || err != nil {
			t.Errorf("Wait after Kill: %d %v", code, err)
		}
		eventually(t, "sleep 103 to be gone", func() bool { return !contains(run(t, p, id, "ps -o args").Stdout, "sleep 103") })
	})
	t.Run("OwnSIGKILL", func(t *testing.T) {
		// A process SIGKILLed in a sandbox that lives on has exited with
		// 137; only a stopped sandbox makes it lost.
		proc, err := p.StartProcess(ctx, id, providers.ProcessSpec{Command: "kill -9 $$"})
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
	})
	t.Run("StartErrors", func(t *testing.T) {
		if _, err := p.StartProcess(ctx, id, providers.ProcessSpec{Command: "true", User: "no-such-user"}); !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("unknown user: %v", err)
		}
		if _, err := p.StartProcess(ctx, id, providers.ProcessSpec{Command: "true", Cwd: "/no/such", TTY: true}); !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("missing cwd (tty): %v", err)
		}
		if _, err := p.StartProcess(ctx, "sbx-aaaaaaaaaaaaaaaaaaaa", providers.ProcessSpec{}); !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("unknown sandbox: %v", err)
		}
	})
}

// TestProcessSandboxRemoved: removing the sandbox under a terminal process
// is the process lost (an error, code -1), not an exit of its own.
func TestProcessSandboxRemoved(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	proc, err := p.StartProcess(ctxFor(t, time.Minute), id, providers.ProcessSpec{TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	out, join := drain(proc.Stdout())
	defer join()
	io.WriteString(proc.Stdin(), "echo rea\"\"dy\n")
	waitOutput(t, out, "ready")
	if err := p.Delete(ctxFor(t, time.Minute), id); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	var code int
	go func() {
		defer close(waited)
		code, err = proc.Wait()
	}()
	select {
	case <-waited:
	case <-time.After(20 * time.Second):
		t.Fatal("Wait hangs after the sandbox was removed")
	}
	if code != -1 || !(errors.Is(err, providers.ErrNotFound) || errors.Is(err, providers.ErrConflict)) {
		t.Errorf("Wait after the sandbox was removed: %d %v, want -1 and ErrNotFound or ErrConflict", code, err)
	}
}
