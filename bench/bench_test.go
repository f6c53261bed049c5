package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/testkit"
)

// gatewayBin is the gateway (and sandgate-agent beside it) built once for
// the tests, as make build builds them.
var gatewayBin string

func TestMain(m *testing.M) {
	var err error
	if gatewayBin, err = testkit.BuildGateway(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// TestHarnessQuick runs every scenario once with small sizes on the local
// provider (and docker where a daemon is, always in CI): the harness
// works end to end and writes its table, JSON and chart. Beside the soak:
// each waits on its own gateway more than on the CPU.
func TestHarnessQuick(t *testing.T) {
	testkit.RequireRoot(t)
	t.Parallel()
	providers := "local"
	if err := exec.Command("docker", "info").Run(); err == nil {
		providers += ",docker"
	} else if testkit.CI() {
		t.Fatalf("no docker daemon (CI starts one): %v", err)
	}
	out := t.TempDir()
	o, err := parseFlags([]string{"-quick", "-gateway", gatewayBin, "-providers", providers, "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	rep, err := run(ctx, o, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rep.Results {
		seen[r.Provider]++
		if len(r.Gateway.Values) == 0 || r.Gateway.P50 <= 0 {
			t.Errorf("%s on %s: no samples: %+v", r.Scenario, r.Provider, r.Gateway)
		}
		if r.Baseline != nil && (len(r.Baseline.Values) == 0 || r.Ratio <= 0) {
			t.Errorf("%s on %s: baseline without samples: %+v", r.Scenario, r.Provider, r.Baseline)
		}
		if e, ok := r.Extra["lost results"]; ok && e != 0 {
			t.Errorf("%s on %s: %v results lost (%s)", r.Scenario, r.Provider, e, r.Note)
		}
		if e, ok := r.Extra["errors"]; ok && e != 0 {
			t.Errorf("%s on %s: %v errors (%s)", r.Scenario, r.Provider, e, r.Note)
		}
	}
	// exec, lifecycle, pty, pipe, echo, concurrency, sessions, streams,
	// upload, download, one rollout size, and the commands' start,
	// streaming and held scenarios.
	for _, p := range []string{"local", "docker"} {
		if (p == "local" || providers != "local") && seen[p] != 14 {
			t.Errorf("%d results on %s, want 14", seen[p], p)
		}
	}
	if err := rep.write(out); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", "results.svg"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestSoakShort is the soak for 60 s (SANDGATE_SOAK_TIME to change):
// mixed traffic with connections cut under attached sessions and
// takeovers, no unexpected error, no byte lost, flat memory.
func TestSoakShort(t *testing.T) {
	testkit.RequireRoot(t)
	t.Parallel()
	d := time.Minute
	if s := os.Getenv("SANDGATE_SOAK_TIME"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	g, err := startGateway(gatewayBin, "local")
	if err != nil {
		t.Fatal(err)
	}
	defer g.stop()
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Minute)
	defer cancel()
	res, err := soak(ctx, g, d, 10, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range res.Errors {
		t.Error(e)
	}
	for op, n := range res.Ops {
		if n == 0 {
			t.Errorf("no %s ran", op)
		}
	}
	if len(res.Ops) != 5 || res.Drops == 0 {
		t.Errorf("ops %v, %d connections cut: the soak did not exercise everything", res.Ops, res.Drops)
	}
	if !res.MemoryFlat {
		t.Errorf("heap grew from %.1f MiB after warm-up to %.1f MiB", res.HeapWarm/(1<<20), res.HeapEnd/(1<<20))
	}
}

// TestQuickWritesAside: -quick without -out never writes the committed
// bench/results; with -out it writes where told.
func TestQuickWritesAside(t *testing.T) {
	o, err := parseFlags([]string{"-quick"})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(o.out)
	if o.out == "bench/results" || !strings.Contains(o.out, "sandgate-bench-quick-") {
		t.Errorf("-quick writes to %s", o.out)
	}
	if o, err := parseFlags([]string{"-quick", "-out", "x"}); err != nil || o.out != "x" {
		t.Errorf("-quick -out x: %v, %s", err, o.out)
	}
	if o, err := parseFlags(nil); err != nil || o.out != "bench/results" {
		t.Errorf("full run: %v, %s", err, o.out)
	}
}
