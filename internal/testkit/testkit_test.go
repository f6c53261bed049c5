package testkit

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fatalTB records a Fatalf and ends the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatalOf runs fn with a fatalTB on a goroutine of its own and returns
// its Fatalf message ("" if fn returned).
func fatalOf(t *testing.T, fn func(tb testing.TB)) string {
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.msg
}

func TestEventually(t *testing.T) {
	n := 0
	Eventually(t, "the third poll", time.Minute, func() bool { n++; return n == 3 })
	if n != 3 {
		t.Fatalf("polled %d times, want 3", n)
	}
	msg := fatalOf(t, func(tb testing.TB) {
		Eventually(tb, "the impossible", 30*time.Millisecond, func() bool { return false })
	})
	if msg != "timed out after 30ms waiting for the impossible" {
		t.Fatalf("message %q", msg)
	}
	msg = fatalOf(t, func(tb testing.TB) {
		EventuallyNil(tb, "a pony", 30*time.Millisecond, func() error { return errors.New("still no pony") })
	})
	if msg != "timed out after 30ms waiting for a pony; last: still no pony" {
		t.Fatalf("message %q", msg)
	}
}

func TestUntil(t *testing.T) {
	if err := Until(t.Context(), func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := Until(ctx, func() bool { return false }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Until past its deadline: %v", err)
	}
}

func TestNeed(t *testing.T) {
	t.Setenv("CI", "true")
	if msg := fatalOf(t, func(tb testing.TB) { Need(tb, "a unicorn", errors.New("none in the stable")) }); msg != "a unicorn is required in CI: none in the stable" {
		t.Fatalf("in CI: %q", msg)
	}
	if msg := fatalOf(t, func(tb testing.TB) { Need(tb, "a unicorn", nil) }); msg != "" {
		t.Fatalf("met: %q", msg)
	}
}

func TestClock(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	c := NewClock(start)
	c.Advance(time.Hour)
	if got := c.Now(); !got.Equal(start.Add(time.Hour)) {
		t.Fatalf("Now %v after an hour from %v", got, start)
	}
}

// echo serves ln, echoing each line back, until ln closes.
func echo(t *testing.T, network string) string {
	var ln net.Listener
	var err error
	if network == "unix" {
		ln, err = net.Listen("unix", t.TempDir()+"/echo.sock")
	} else {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader, line string) (string, error) {
	c.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func TestProxy(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			p := NewProxy(t, network, echo(t, network))
			c, err := net.Dial(network, p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := bufio.NewReader(c)
			if got, err := roundTrip(c, r, "hello"); err != nil || got != "hello" {
				t.Fatalf("through the proxy: %q %v", got, err)
			}
			if n := p.Sever(); n != 1 {
				t.Fatalf("Sever closed %d client connections, want 1", n)
			}
			if _, err := roundTrip(c, r, "again"); err == nil {
				t.Fatal("a severed connection still carries data")
			}
			// Severed, not cut: a new connection goes through.
			c2, err := net.Dial(network, p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if got, err := roundTrip(c2, bufio.NewReader(c2), "second"); err != nil || got != "second" {
				t.Fatalf("after Sever: %q %v", got, err)
			}
			p.Cut()
			if _, err := roundTrip(c2, bufio.NewReader(c2), "cut"); err == nil {
				t.Fatal("a cut connection still carries data")
			}
			if c3, err := net.Dial(network, p.Addr()); err == nil {
				c3.Close()
				t.Fatal("a cut proxy accepted a connection")
			}
			p.Restore(t)
			c4, err := net.Dial(network, p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c4.Close()
			if got, err := roundTrip(c4, bufio.NewReader(c4), "restored"); err != nil || got != "restored" {
				t.Fatalf("after Restore: %q %v", got, err)
			}
		})
	}
}

// TestIdleProxy: a connection that carries a byte either way within the
// idle timeout lives on; one quiet for longer is closed.
func TestIdleProxy(t *testing.T) {
	const idle = 200 * time.Millisecond
	p := NewIdleProxy(t, "tcp", echo(t, "tcp"), idle)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	// Busy for 3 timeouts in all, never quiet for half of one.
	for deadline := time.Now().Add(3 * idle); time.Now().Before(deadline); {
		if got, err := roundTrip(c, r, "busy"); err != nil || got != "busy" {
			t.Fatalf("a busy connection: %q %v (idle cuts %d)", got, err, p.IdleCuts())
		}
		<-time.After(idle / 4) // the traffic's pace, not a wait for a condition
	}
	if p.IdleCuts() != 0 {
		t.Fatalf("%d idle cuts of a busy connection", p.IdleCuts())
	}
	c.SetReadDeadline(time.Now().Add(100 * idle)) // catches a hang only
	if _, err := r.ReadByte(); err == nil {
		t.Fatal("read a byte nobody sent")
	}
	if p.IdleCuts() != 1 {
		t.Fatalf("%d idle cuts, want 1", p.IdleCuts())
	}
}

// Build builds once per key and applies ldflags; binaries of one name
// and flags share a directory.
func TestBuild(t *testing.T) {
	const pkg = "internal/testkit/testdata/hello"
	bin := Binary(t, pkg, "hello", "-X main.greeting=hi")
	out, err := exec.Command(bin).Output()
	if err != nil || string(out) != "hi\n" {
		t.Fatalf("%s: %q %v", bin, out, err)
	}
	if again := Binary(t, Module+"/"+pkg, "hello", "-X main.greeting=hi"); again != bin {
		t.Fatalf("built again at %s (first %s)", again, bin)
	}
	plain := Binary(t, pkg, "hello", "")
	if plain == bin {
		t.Fatal("other ldflags, same binary")
	}
	if out, err := exec.Command(plain).Output(); err != nil || string(out) != "hello\n" {
		t.Fatalf("%s: %q %v", plain, out, err)
	}
}

// TestDialPipe: the client talks to serve through the pipe; at the
// test's end the client is closed before serve is waited for, and a dial
// that fails fails the test with serve already returned.
func TestDialPipe(t *testing.T) {
	var order []string
	echo := func(a net.Conn) {
		io.Copy(a, a)
		order = append(order, "served")
	}
	t.Run("echo", func(t *testing.T) {
		c := DialPipe(t, echo, func(b net.Conn) (net.Conn, error) { return closeLogger{b, &order}, nil })
		if _, err := c.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 2)
		if _, err := io.ReadFull(c, got); err != nil || string(got) != "hi" {
			t.Fatalf("read %q, %v", got, err)
		}
	})
	if strings.Join(order, ",") != "client closed,served" {
		t.Fatalf("clean-up order %v, want the client closed, then serve returned", order)
	}

	order = nil
	msg := fatalOf(t, func(tb testing.TB) {
		DialPipe(tb, echo, func(b net.Conn) (net.Conn, error) { return nil, errors.New("no hello") })
	})
	if msg != "dial over the pipe: no hello" || strings.Join(order, ",") != "served" {
		t.Fatalf("failed dial: fatal %q, %v", msg, order)
	}
}

// closeLogger notes its Close in order.
type closeLogger struct {
	net.Conn
	order *[]string
}

func (c closeLogger) Close() error {
	*c.order = append(*c.order, "client closed")
	return c.Conn.Close()
}

// errorsTB records Errorf calls.
type errorsTB struct {
	testing.TB
	msgs []string
}

func (e *errorsTB) Helper() {}
func (e *errorsTB) Errorf(format string, args ...any) {
	e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
}

func TestWantFields(t *testing.T) {
	errs := []providers.FieldError{{Field: "cpu", Message: "over the ceiling of 4"}, {Field: "ttl_s", Message: "too long"}}
	for _, c := range []struct {
		want map[string]string
		msgs []string
	}{
		{map[string]string{"cpu": "ceiling of 4", "ttl_s": "long"}, nil},
		{map[string]string{"cpu": "ceiling of 8", "ttl_s": "long"}, []string{`cpu: "over the ceiling of 4", want it to say "ceiling of 8"`}},
		{map[string]string{"cpu": "ceiling"}, []string{"other problems listed: map[ttl_s:too long]"}},
		{map[string]string{"cpu": "ceiling", "ttl_s": "long", "env": "big"}, []string{`env: "", want it to say "big"`}},
	} {
		e := &errorsTB{TB: t}
		WantFields(e, errs, c.want)
		if strings.Join(e.msgs, "\n") != strings.Join(c.msgs, "\n") {
			t.Errorf("want %v: reported %q, want %q", c.want, e.msgs, c.msgs)
		}
	}
}

// TestWaitingParallel: the package's -test.parallel becomes n, unless the
// command line set it.
func TestWaitingParallel(t *testing.T) {
	f := flag.Lookup("test.parallel")
	before := f.Value.String()
	t.Cleanup(func() { f.Value.Set(before) })
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	WaitingParallel(64)
	want := "64"
	if explicit {
		want = before
	}
	if got := f.Value.String(); got != want {
		t.Fatalf("-test.parallel %s after WaitingParallel(64) (was %s, set on the command line: %v), want %s", got, before, explicit, want)
	}
}
