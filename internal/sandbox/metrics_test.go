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

func TestExecLimits(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxExecsPerSandbox = 2; o.MaxExecs = 3 })
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	b := e.create(t, CreateRequest{})
	release := make(chan struct{})
	started := make(chan struct{}, 8)
	e.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		started <- struct{}{}
		<-release
		return providers.ExecResult{}, nil
	}
	errs := make(chan error, 8)
	run := func(r Ref) {
		_, err := e.svc.Exec(ctx, lease(r.Token), r.SandboxID, ExecRequest{Command: "x"})
		errs <- err
	}
	go run(a)
	go run(a)
	<-started
	<-started
	_, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "x"})
	wantKind(t, err, providers.ErrTooMany)
	go run(b)
	<-started
	_, err = e.svc.Exec(ctx, lease(b.Token), b.SandboxID, ExecRequest{Command: "x"})
	wantKind(t, err, providers.ErrTooMany)
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	e.p.ExecFunc = nil
	if _, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "x"}); err != nil {
		t.Fatalf("after the slots freed: %v", err)
	}
}
