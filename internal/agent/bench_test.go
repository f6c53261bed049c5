package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// BenchmarkSessionEcho times one byte typed into a raw-mode cat held by
// the agent and echoed back over an attachment on a connection of its own
// (as the gateway's local provider attaches), beside the same echo read
// straight from a PTY the benchmark holds (the floor). p50 of each.
func BenchmarkSessionEcho(b *testing.B) {
	srv, c := pairDirect(b)
	ctx := context.Background()
	if _, err := c.StartSession(ctx, "e", providers.ProcessSpec{Command: "stty raw -echo; echo READY; exec cat", TTY: true}, false, 0); err != nil {
		b.Fatal(err)
	}
	a, err := c.Attach(ctx, "e", 0, nil, agentwire.DefaultRing)
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	for seen := string(a.Replay); !strings.Contains(seen, "READY"); {
		ev, err := a.Next()
		if err != nil {
			b.Fatal(err)
		}
		seen += string(ev.Data)
	}
	floor, err := srv.startProcess(ctx, providers.ProcessSpec{Command: "stty raw -echo; echo READY; exec cat", TTY: true})
	if err != nil {
		b.Fatal(err)
	}
	defer floor.Kill()
	buf := make([]byte, 4096)
	for seen := ""; !strings.Contains(seen, "READY"); {
		n, err := floor.Stdout().Read(buf)
		if err != nil {
			b.Fatal(err)
		}
		seen += string(buf[:n])
	}
	var viaAgent, direct []time.Duration
	for b.Loop() {
		t0 := time.Now()
		a.Input([]byte("k"))
		for got := false; !got; {
			ev, err := a.Next()
			if err != nil {
				b.Fatal(err)
			}
			got = len(ev.Data) > 0
		}
		t1 := time.Now()
		floor.Stdin().Write([]byte("k"))
		if _, err := floor.Stdout().Read(buf); err != nil {
			b.Fatal(err)
		}
		viaAgent, direct = append(viaAgent, t1.Sub(t0)), append(direct, time.Since(t1))
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Nanoseconds()) / 1e3
	}
	b.ReportMetric(p50(viaAgent), "agent-p50-µs")
	b.ReportMetric(p50(direct), "pty-p50-µs")
}

// BenchmarkIdleWake times a one-byte round trip between two Go processes
// over a unix socket (the hop between the gateway and a sandbox's agent,
// with neither's work), back to back and with a pause after each, beside
// the same between two goroutines of one process: what waking an idle Go
// process costs on this machine (the README's performance section, issue
// 24's fourth pass). p50 of each.
func BenchmarkIdleWake(b *testing.B) {
	for _, idle := range []time.Duration{0, 200 * time.Microsecond} {
		b.Run(fmt.Sprintf("pause=%v", idle), func(b *testing.B) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			theirs := os.NewFile(uintptr(fds[1]), "helper")
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), echoHelperEnv+"=1")
			cmd.ExtraFiles = []*os.File{theirs}
			err = cmd.Start()
			theirs.Close()
			if err != nil {
				b.Fatal(err)
			}
			other := fileConn(b, fds[0])
			defer func() { other.Close(); cmd.Wait() }()
			fds, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				b.Fatal(err)
			}
			mine, peer := fileConn(b, fds[0]), fileConn(b, fds[1])
			echoed := make(chan struct{})
			go func() { defer close(echoed); echo(peer) }()
			defer func() { mine.Close(); <-echoed; peer.Close() }()
			var procs, goroutines []time.Duration
			buf := make([]byte, 1)
			trip := func(c net.Conn) time.Duration {
				t0 := time.Now()
				if _, err := c.Write([]byte("k")); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				if idle > 0 {
					time.Sleep(idle)
				}
				return d
			}
			for b.Loop() {
				procs = append(procs, trip(other))
				goroutines = append(goroutines, trip(mine))
			}
			p50 := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Nanoseconds()) / 1e3
			}
			b.ReportMetric(p50(procs), "processes-p50-µs")
			b.ReportMetric(p50(goroutines), "goroutines-p50-µs")
		})
	}
}

// echoHelperEnv makes the test binary BenchmarkIdleWake's other process.
const echoHelperEnv = "SANDGATE_IDLE_WAKE_HELPER"

// echoHelper echoes descriptor 3 until it ends.
func echoHelper() {
	f := os.NewFile(3, "socket")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		os.Exit(1)
	}
	echo(c)
}

// echo writes back what c reads until it ends.
func echo(c net.Conn) {
	b := make([]byte, 64)
	for {
		n, err := c.Read(b)
		if err != nil {
			return
		}
		if _, err := c.Write(b[:n]); err != nil {
			return
		}
	}
}

// fileConn is descriptor fd as a net.Conn (the descriptor is its own).
func fileConn(t testing.TB, fd int) net.Conn {
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
