package agentclient

import (
	"context"
	"errors"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// TestMetricsLies: samples from an agent the sandbox replaced are checked
// before the gateway uses them; each lie is a violation, and a sane reply
// passes.
func TestMetricsLies(t *testing.T) {
	now := time.Now().UTC()
	good := providers.Metrics{Time: now, CPUCount: 2, CPUUsedPct: 12.5, MemUsed: 1 << 20, MemTotal: 1 << 30, DiskUsed: 1 << 20, DiskTotal: 1 << 30}
	many := make([]providers.Metrics, providers.MaxMetrics+1)
	for i := range many {
		many[i] = good
	}
	lies := map[string][]providers.Metrics{
		"cpu over 100":          {func() providers.Metrics { m := good; m.CPUUsedPct = 1e9; return m }()},
		"cpu negative":          {func() providers.Metrics { m := good; m.CPUUsedPct = -1; return m }()},
		"no cpus":               {func() providers.Metrics { m := good; m.CPUCount = 0; return m }()},
		"cpus beyond a machine": {func() providers.Metrics { m := good; m.CPUCount = math.MaxInt32; return m }()},
		"memory over its total": {func() providers.Metrics { m := good; m.MemUsed = m.MemTotal + 1; return m }()},
		"negative disk":         {func() providers.Metrics { m := good; m.DiskUsed = -1; return m }()},
		"disk beyond bounds":    {func() providers.Metrics { m := good; m.DiskUsed, m.DiskTotal = math.MaxInt64, math.MaxInt64; return m }()},
		"no time":               {func() providers.Metrics { m := good; m.Time = time.Time{}; return m }()},
		"out of order":          {good, func() providers.Metrics { m := good; m.Time = now.Add(-time.Hour); return m }()},
		"too many samples":      many,
	}
	for name, ms := range lies {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
				agentwire.WriteMsg(st, agentwire.Reply{Metrics: ms})
			})
			if got, err := c.Metrics(context.Background()); !errors.Is(err, ErrViolation) {
				t.Fatalf("%s: got %v, %v; want a violation", name, got, err)
			}
		})
	}
	// An agent that predates the op says so; the gateway says what it means.
	old := dialLiar(t, func(req agentwire.Request, st net.Conn) {
		agentwire.WriteMsg(st, agentwire.Reply{Error: `unknown op "metrics"`, Kind: "unsupported"})
	})
	if _, err := old.Metrics(context.Background()); !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(providers.Message(err), "older build") {
		t.Fatalf("an agent without the op: %v", err)
	}
	c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
		agentwire.WriteMsg(st, agentwire.Reply{Metrics: []providers.Metrics{good, good}})
	})
	if got, err := c.Metrics(context.Background()); err != nil || len(got) != 2 || got[1] != good {
		t.Fatalf("a sane reply: %v %v", got, err)
	}
}
