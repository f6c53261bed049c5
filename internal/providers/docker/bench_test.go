package docker

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// The benchmarks run the provider and the docker CLI side by side, in one
// loop, on the same daemon and image:
//
//	go test -run '^$' -bench 'CreateFirstExec|ExecTrue' -benchtime 30x ./internal/providers/docker/
//	go test -run '^$' -bench ConcurrentCreate50 -benchtime 2x ./internal/providers/docker/

func cli(b *testing.B, args ...string) string {
	b.Helper()
	out, err := exec.Command(dockerCLI(b), args...).CombinedOutput()
	if err != nil {
		b.Fatalf("docker %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// cliRun is the CLI's equivalent of a provider create.
func cliRun(b *testing.B) string {
	return cli(b, "run", "-d", "--init", "--network", "none", "--pids-limit", "1024",
		"--cap-drop", "NET_RAW", "--cap-drop", "MKNOD", "--cap-drop", "AUDIT_WRITE", "--cap-drop", "SETFCAP",
		"-w", "/workspace", "--label", "sandgate.bench=1", "--entrypoint", "/bin/sh", dockertest.ImageRef, "-c", "while :; do sleep 3600; done")
}

// sideBySide reports the mean of each side's timed runs and their ratio.
type sideBySide struct{ provider, cli time.Duration }

func (s sideBySide) report(b *testing.B, n int) {
	pm := float64(s.provider.Microseconds()) / float64(n) / 1000
	cm := float64(s.cli.Microseconds()) / float64(n) / 1000
	b.ReportMetric(pm, "provider-ms")
	b.ReportMetric(cm, "cli-ms")
	b.ReportMetric(pm/cm, "provider/cli")
}

// BenchmarkCreateFirstExec alternates, in each iteration, a provider
// Create + Exec of true with `docker run -d` + `docker exec true`, so both
// sides see the same daemon state. Removal is not timed.
func BenchmarkCreateFirstExec(b *testing.B) {
	p := newProvider(b)
	ctx := context.Background()
	var s sideBySide
	n := 0
	for b.Loop() {
		n++
		t0 := time.Now()
		id := providertest.NewID()
		if _, err := p.Create(ctx, providers.CreateSpec{ID: id, Image: dockertest.ImageRef, Workdir: "/workspace", ReadyTimeout: time.Minute}); err != nil {
			b.Fatal(err)
		}
		if res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 1024}); err != nil || res.ExitCode != 0 {
			b.Fatal(err, res.ExitCode)
		}
		t1 := time.Now()
		cid := cliRun(b)
		cli(b, "exec", cid, "true")
		t2 := time.Now()
		s.provider += t1.Sub(t0)
		s.cli += t2.Sub(t1)
		b.StopTimer()
		p.Delete(ctx, id)
		cli(b, "rm", "-f", cid)
		b.StartTimer()
	}
	s.report(b, n)
}

// BenchmarkExecTrue alternates an Exec of true through the provider and
// `docker exec <container> true`, on two sandboxes of the same image.
func BenchmarkExecTrue(b *testing.B) {
	p := newProvider(b)
	id := create(b, p, providers.CreateSpec{})
	cid := cliRun(b)
	b.Cleanup(func() { exec.Command("docker", "rm", "-f", cid).Run() })
	ctx := context.Background()
	var s sideBySide
	n := 0
	for b.Loop() {
		n++
		t0 := time.Now()
		if res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 1024}); err != nil || res.ExitCode != 0 {
			b.Fatal(err, res.ExitCode)
		}
		t1 := time.Now()
		cli(b, "exec", cid, "true")
		s.provider += t1.Sub(t0)
		s.cli += time.Since(t1)
	}
	s.report(b, n)
}

// BenchmarkConcurrentCreate50 creates 50 sandboxes at once per iteration
// and reports the wall time and the p50/p99 of the single creates.
func BenchmarkConcurrentCreate50(b *testing.B) {
	const n = 50
	p := newProvider(b)
	ctx := context.Background()
	var all []time.Duration
	var walls []time.Duration
	for b.Loop() {
		ids := make([]string, n)
		durs := make([]time.Duration, n)
		errs := make([]error, n)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range n {
			ids[i] = providertest.NewID()
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				_, errs[i] = p.Create(ctx, providers.CreateSpec{ID: ids[i], Image: dockertest.ImageRef, Workdir: "/workspace", ReadyTimeout: 2 * time.Minute})
				durs[i] = time.Since(t0)
			}()
		}
		wg.Wait()
		walls = append(walls, time.Since(start))
		all = append(all, durs...)
		b.StopTimer()
		for i, id := range ids {
			if errs[i] != nil {
				b.Errorf("create %d: %v", i, errs[i])
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.Delete(ctx, id)
			}()
		}
		wg.Wait()
		b.StartTimer()
	}
	slices.Sort(all)
	slices.Sort(walls)
	b.ReportMetric(float64(walls[len(walls)/2].Milliseconds()), "wall-ms")
	b.ReportMetric(float64(all[len(all)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(all[len(all)*99/100].Milliseconds()), "p99-ms")
}

// BenchmarkCreateWithPorts alternates, in each iteration, a create (and a
// first exec) of a sandbox with a port on a network of its own, as every
// such create is now, and one on the shared default bridge, as they were
// before; then the deletes of both, timed too.
func BenchmarkCreateWithPorts(b *testing.B) {
	p := newProvider(b, func(o *Options) { o.Networks = []string{"bridge"} })
	ctx := context.Background()
	var own, shared, ownDel, sharedDel time.Duration
	n := 0
	timed := func(network string) (string, time.Duration) {
		t0 := time.Now()
		id := providertest.NewID()
		spec := providers.CreateSpec{ID: id, Image: dockertest.ImageRef, Workdir: "/workspace", Ports: []int{8080}, ReadyTimeout: time.Minute}
		if network != "" {
			spec.Options = map[string]any{"network": network}
		}
		if _, err := p.Create(ctx, spec); err != nil {
			b.Fatal(err)
		}
		if res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 1024}); err != nil || res.ExitCode != 0 {
			b.Fatal(err, res.ExitCode)
		}
		return id, time.Since(t0)
	}
	deleted := func(id string) time.Duration {
		t0 := time.Now()
		if err := p.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for b.Loop() {
		n++
		a, d1 := timed("")
		s, d2 := timed("bridge")
		own, shared = own+d1, shared+d2
		b.StopTimer()
		ownDel, sharedDel = ownDel+deleted(a), sharedDel+deleted(s)
		b.StartTimer()
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) / 1000 }
	b.ReportMetric(ms(own), "own-net-create-ms")
	b.ReportMetric(ms(shared), "bridge-create-ms")
	b.ReportMetric(ms(ownDel), "own-net-delete-ms")
	b.ReportMetric(ms(sharedDel), "bridge-delete-ms")
}
