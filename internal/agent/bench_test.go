package agent

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

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
