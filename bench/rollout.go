package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The rollout scenario: n sandboxes at once, each living one RL rollout as
// NeMo Gym's remote provider drives it (create, upload a file, 20 execs,
// download, delete); the same against the docker CLI is docker's
// baseline.

const rolloutExecs = 20

// rolloutStats is one run of n rollouts.
type rolloutStats struct {
	wall   time.Duration
	execs  []time.Duration
	errors int64
	first  error
}

func (s *rolloutStats) fail(err error) {
	if atomic.AddInt64(&s.errors, 1) == 1 {
		s.first = err
	}
}

// rollouts runs n rollouts at once through one driver and gathers their
// exec latencies.
func rollouts(ctx context.Context, n int, one func(ctx context.Context, i int, exec func(func() error) error) error) *rolloutStats {
	st := &rolloutStats{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timedExec := func(f func() error) error {
				d, err := timed(f)
				if err == nil {
					mu.Lock()
					st.execs = append(st.execs, d)
					mu.Unlock()
				}
				return err
			}
			if err := one(ctx, i, timedExec); err != nil {
				st.fail(fmt.Errorf("rollout %d: %w", i, err))
			}
		}()
	}
	wg.Wait()
	st.wall = time.Since(t0)
	return st
}

// rollout measures n concurrent rollouts through the gateway (and, on
// docker, through the CLI).
func (b *bench) rollout(ctx context.Context, n int) (Result, error) {
	payload := bytes.Repeat([]byte("rollout input\n"), 4096) // 56 KiB
	cpu0, _ := b.g.usage()
	st := rollouts(ctx, n, func(ctx context.Context, i int, exec func(func() error) error) error {
		sb, err := b.sandbox(ctx)
		if err != nil {
			return err
		}
		defer b.g.delete(context.WithoutCancel(ctx), sb)
		if err := b.g.upload(ctx, sb, "/tmp/input.txt", bytes.NewReader(payload)); err != nil {
			return err
		}
		for k := range rolloutExecs {
			if err := exec(func() error {
				_, err := b.g.exec(ctx, sb, fmt.Sprintf("wc -c < /tmp/input.txt > /tmp/out.%d", k))
				return err
			}); err != nil {
				return err
			}
		}
		got, err := b.g.download(ctx, sb, "/tmp/out.0", io.Discard)
		if err == nil && got == 0 {
			err = fmt.Errorf("empty download")
		}
		return err
	})
	cpu, peak := b.g.usage()
	r := compare(fmt.Sprintf("rollouts ×%d: exec under load", n), b.g.provider, "ms", series("gateway", millis(st.execs)), nil)
	r.Extra = map[string]float64{
		"rollouts/s":            float64(n) / st.wall.Seconds(),
		"gateway CPU s/rollout": (cpu - cpu0).Seconds() / float64(n),
		"gateway peak RSS MiB":  float64(peak) / (1 << 20),
		"errors":                float64(st.errors),
		"wall s":                st.wall.Seconds(),
	}
	if st.first != nil {
		r.Note = "first error: " + st.first.Error()
	}
	if b.g.provider == "docker" {
		base := b.dockerRollouts(ctx, n, payload)
		s := series("docker CLI", millis(base.execs))
		r.Baseline = &s
		if s.P50 > 0 {
			r.Ratio = r.Gateway.P50 / s.P50
		}
		r.Extra["CLI rollouts/s"] = float64(n) / base.wall.Seconds()
		r.Extra["CLI errors"] = float64(base.errors)
	}
	r.judge("zero errors", st.errors == 0)
	return r, nil
}

// dockerRollouts is the rollout driven with the docker CLI.
func (b *bench) dockerRollouts(ctx context.Context, n int, payload []byte) *rolloutStats {
	dir, err := os.MkdirTemp("", "sandgate-bench-rollout-")
	if err != nil {
		return &rolloutStats{errors: int64(n), first: err}
	}
	defer os.RemoveAll(dir)
	in := dir + "/input.txt"
	if err := os.WriteFile(in, payload, 0o644); err != nil {
		return &rolloutStats{errors: int64(n), first: err}
	}
	return rollouts(ctx, n, func(ctx context.Context, i int, exec func(func() error) error) error {
		cid, err := dockerRun(ctx, b.image)
		if err != nil {
			return err
		}
		defer docker(context.WithoutCancel(ctx), "rm", "-f", cid)
		if _, err := docker(ctx, "cp", in, cid+":/tmp/input.txt"); err != nil {
			return err
		}
		for k := range rolloutExecs {
			if err := exec(func() error {
				_, err := docker(ctx, "exec", cid, "sh", "-c", fmt.Sprintf("wc -c < /tmp/input.txt > /tmp/out.%d", k))
				return err
			}); err != nil {
				return err
			}
		}
		_, err = docker(ctx, "cp", cid+":/tmp/out.0", fmt.Sprintf("%s/out.%d", dir, i))
		return err
	})
}
