package docker

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestDaemonDown: with the daemon unreachable, Ping and every call that
// needs it fail fast with ErrUnavailable; when it is back the same
// provider works again. On the exec path an exec in flight ends promptly
// with an error, and so do exec and files; on the direct path they do not
// need the daemon: the exec in flight runs on, and new ones work.
func TestDaemonDown(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			testDaemonDown(t, tr)
		})
	}
}

func testDaemonDown(t *testing.T, transport string) {
	px := dockertest.NewProxy(t)
	p := newProvider(t, func(o *Options) {
		o.Host = px.Host()
		o.PingTimeout = time.Second
		if transport == TransportExec {
			o.AgentTransport = TransportExec
		}
	})
	id := create(t, p, providers.CreateSpec{})
	if got := p.Transport(id); got != transport {
		t.Fatalf("transport %q, want %q", got, transport)
	}

	done := make(chan error, 1)
	flight, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, err := p.Exec(flight, id, providers.ExecRequest{Command: "sleep 300", Timeout: 5 * time.Minute, MaxOutput: 1024})
		done <- err
	}()
	m := "sleep 300"
	testkit.Eventually(t, "the sleep to start", 20*time.Second, func() bool {
		return contains(run(t, p, id, "ps -o args").Stdout, m)
	})

	px.Cut()
	ctx := ctxFor(t, time.Minute)
	calls := map[string]func() error{
		"Ping":   func() error { return p.Ping(ctx) },
		"Status": func() error { _, err := p.Status(ctx, id); return err },
		"List":   func() error { _, err := p.List(ctx); return err },
		"Create": func() error {
			_, err := p.Create(ctx, providers.CreateSpec{ID: "sbx-aaaaaaaaaaaaaaaaaaab", Image: dockertest.ImageRef, Workdir: "/w", ReadyTimeout: time.Minute})
			return err
		},
	}
	dataPlane := map[string]func() error{
		"Exec": func() error {
			_, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 10})
			return err
		},
		"ReadFile": func() error {
			r, _, err := p.ReadFile(ctx, id, "/etc/passwd")
			if err == nil {
				r.Close()
			}
			return err
		},
	}
	if transport == TransportExec {
		select {
		case err := <-done:
			if !errors.Is(err, providers.ErrUnavailable) {
				t.Errorf("Exec in flight when the daemon went away: %v, want ErrUnavailable", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("Exec hangs with the daemon gone")
		}
		maps.Copy(calls, dataPlane)
	} else {
		for name, call := range dataPlane {
			if err := call(); err != nil {
				t.Errorf("%s on the direct path with the daemon down: %v", name, err)
			}
		}
		select {
		case err := <-done:
			t.Fatalf("Exec in flight on the direct path ended when the daemon went away: %v", err)
		default:
		}
	}
	// Failing fast is the subject, but the bound only catches a call that
	// waits for its context (a minute) or retries: 10x the ping timeout.
	for name, call := range calls {
		start := time.Now()
		err := call()
		if !errors.Is(err, providers.ErrUnavailable) {
			t.Errorf("%s with the daemon down: %v, want ErrUnavailable", name, err)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("%s took %v to fail", name, el)
		}
	}

	px.Restore(t)
	if err := p.Ping(ctx); err != nil {
		t.Fatalf("Ping after the daemon came back: %v", err)
	}
	if out := run(t, p, id, "echo back"); string(out.Stdout) != "back\n" {
		t.Errorf("exec after the daemon came back: %q %q", out.Stdout, out.Stderr)
	}
	if transport == TransportDirect {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("the exec in flight, cancelled: %v", err)
		}
	}
}

func contains(b []byte, s string) bool { return strings.Contains(string(b), s) }

// TestRealDaemonRestart stops the real daemon (the one whose pid is in
// /var/run/docker.pid, as scripts/ci-docker.sh starts it) and starts it
// again. It disturbs every other user of the daemon, so it runs only when
// SANDGATE_DOCKER_RESTART_TEST=1 and never in parallel with other
// packages' docker tests:
//
//	SANDGATE_DOCKER_RESTART_TEST=1 go test -run TestRealDaemonRestart ./internal/providers/docker/
func TestRealDaemonRestart(t *testing.T) {
	if os.Getenv("SANDGATE_DOCKER_RESTART_TEST") != "1" {
		t.Skip("stops the shared daemon; set SANDGATE_DOCKER_RESTART_TEST=1")
	}
	p := newProvider(t, func(o *Options) { o.PingTimeout = time.Second })
	id := create(t, p, providers.CreateSpec{})
	b, err := os.ReadFile("/var/run/docker.pid")
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(context.Background(), id, providers.ExecRequest{Command: "sleep 300", Timeout: 5 * time.Minute, MaxOutput: 1024})
		done <- err
	}()
	testkit.Eventually(t, "the sleep to start", 20*time.Second, func() bool { return contains(run(t, p, id, "ps -o args").Stdout, "sleep 300") })
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Logf("Exec in flight when the daemon stopped: %v", err)
		if err == nil {
			t.Error("Exec in flight returned no error when the daemon stopped")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Exec hangs with the daemon stopping")
	}
	ctx := ctxFor(t, 3*time.Minute)
	testkit.Eventually(t, "the daemon to stop answering", 20*time.Second, func() bool { return p.Ping(ctx) != nil })
	// The pid file goes when the daemon has exited.
	testkit.Eventually(t, "dockerd to exit", 20*time.Second, func() bool { return syscall.Kill(pid, 0) != nil })
	start := time.Now()
	if err := p.Ping(ctx); !errors.Is(err, providers.ErrUnavailable) {
		t.Errorf("Ping with the daemon down: %v", err)
	}
	if _, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 10}); !errors.Is(err, providers.ErrUnavailable) {
		t.Errorf("Exec with the daemon down: %v", err)
	}
	if el := time.Since(start); el > 10*time.Second { // 10x the ping timeout: catches a wait for ctx, not load
		t.Errorf("failing took %v", el)
	}

	log, err := os.OpenFile("/tmp/dockerd.log", os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	d := exec.Command("dockerd")
	d.Stdout, d.Stderr = log, log
	d.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	// The daemon outlives the test; release it.
	d.Process.Release()
	testkit.Eventually(t, "the daemon to come back", 60*time.Second, func() bool { return p.Ping(ctx) == nil })
	// Without live-restore the container died with the daemon.
	if st, err := p.Status(ctx, id); err != nil || st != providers.StateStopped {
		t.Errorf("Status after the restart: %q %v", st, err)
	}
	id2 := create(t, p, providers.CreateSpec{})
	if out := run(t, p, id2, "echo recovered"); string(out.Stdout) != "recovered\n" {
		t.Errorf("exec after the restart: %q", out.Stdout)
	}
}
