package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
)

func TestServiceMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	e := newEnv(t, func(o *Options) { o.Metrics = m; o.MaxSandboxes = 2; o.QueueTimeout = 20 * time.Millisecond })
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	b := e.create(t, CreateRequest{})
	if _, err := e.svc.Create(ctx, Caller{}, CreateRequest{}); providers.Kind(err) != providers.ErrUnavailable {
		t.Fatalf("over capacity: %v", err)
	}
	e.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		switch req.Command {
		case "slow":
			return providers.ExecResult{ExitCode: 125, TimedOut: true}, nil
		case "fail":
			return providers.ExecResult{ExitCode: 1}, nil
		case "boom":
			return providers.ExecResult{}, errors.New("runtime gone")
		}
		return providers.ExecResult{}, nil
	}
	for _, c := range []string{"ok", "ok", "fail", "slow", "boom"} {
		if _, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: c}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.svc.Pause(ctx, lease(b.Token), b.SandboxID); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Delete(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		got, want float64
	}{
		"creates ok":          {testutil.ToFloat64(m.CreatesTotal.WithLabelValues("fake", "ok")), 2},
		"creates unavailable": {testutil.ToFloat64(m.CreatesTotal.WithLabelValues("fake", "unavailable")), 1},
		"exec ok":             {testutil.ToFloat64(m.ExecTotal.WithLabelValues("ok")), 2},
		"exec nonzero":        {testutil.ToFloat64(m.ExecTotal.WithLabelValues("nonzero")), 1},
		"exec timeout":        {testutil.ToFloat64(m.ExecTotal.WithLabelValues("timeout")), 1},
		"exec sandbox":        {testutil.ToFloat64(m.ExecTotal.WithLabelValues("sandbox")), 1},
		"deletes":             {testutil.ToFloat64(m.DeletesTotal.WithLabelValues("deleted")), 1},
		"create histogram":    {float64(testutil.CollectAndCount(m.CreateSeconds)), 1},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", name, c.got, c.want)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]float64{}
	for _, f := range families {
		if f.GetName() == "sandgate_sandboxes" {
			for _, mt := range f.GetMetric() {
				states[mt.GetLabel()[0].GetValue()] = mt.GetGauge().GetValue()
			}
		}
	}
	if states["paused"] != 1 || states["running"] != 0 || len(states) != len(metrics.States) {
		t.Fatalf("sandgate_sandboxes %v", states)
	}
}
