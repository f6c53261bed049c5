package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The figures moving with what a sandbox does are tested on every
// provider's real sandboxes (providertest's Metrics); here the reading of
// cgroup v1 and v2 files, the CPU share over the time between samples,
// and the bound on the samples kept.

// meterPair serves a server whose metrics read cg, and dials it.
func meterPair(t *testing.T, cg *Cgroup) (*Server, *agentclient.Client) {
	t.Helper()
	srv := NewServerWith(NewReaper(false), Options{Cgroup: cg, Root: t.TempDir()})
	srv.own = true
	t.Cleanup(srv.Close)
	return srv, testkit.DialPipe(t, func(a net.Conn) { srv.Serve(a, nil) }, func(b net.Conn) (*agentclient.Client, error) {
		return agentclient.Dial(context.Background(), b)
	})
}

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// backdate moves the server's samples d into the past, as if they had
// been taken then.
func backdate(srv *Server, d time.Duration) {
	m := srv.meter
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.ring {
		m.ring[i].Time = m.ring[i].Time.Add(-d)
	}
	if !m.last.at.IsZero() {
		m.last.at = m.last.at.Add(-d)
	}
	m.start = m.start.Add(-d)
}

func lastSample(t *testing.T, c *agentclient.Client) (providers.Metrics, int) {
	t.Helper()
	ms, err := c.Metrics(context.Background())
	if err != nil || len(ms) == 0 {
		t.Fatalf("Metrics: %v (%d samples)", err, len(ms))
	}
	return ms[len(ms)-1], len(ms)
}

func TestMetricsCgroupV1(t *testing.T) {
	dir := t.TempDir()
	const mib = 1 << 20
	writeFiles(t, dir, map[string]string{
		"cpuacct/cpuacct.usage":        "1000000000\n",
		"memory/memory.usage_in_bytes": strconv.Itoa(300*mib) + "\n",
		"memory/memory.stat":           "cache 1\ntotal_cache " + strconv.Itoa(100*mib) + "\ntotal_inactive_file " + strconv.Itoa(50*mib) + "\n",
		"memory/memory.limit_in_bytes": strconv.Itoa(512*mib) + "\n",
		"cpu/cpu.cfs_quota_us":         "50000\n",
		"cpu/cpu.cfs_period_us":        "100000\n",
	})
	srv, c := meterPair(t, OpenCgroupV1(map[string]string{"cpuacct": dir + "/cpuacct", "memory": dir + "/memory", "cpu": dir + "/cpu"}))
	backdate(srv, 10*time.Second) // the agent started 10 s ago
	m, n := lastSample(t, c)
	if n != 1 || m.CPUCount != 1 || m.MemUsed != 250*mib || m.MemCache != 100*mib || m.MemTotal != 512*mib || m.DiskTotal <= 0 {
		t.Fatalf("first sample (%d): %+v", n, m)
	}
	// 1 s of CPU in 10 s on half a CPU: 20 %.
	if m.CPUUsedPct < 19.5 || m.CPUUsedPct > 20 {
		t.Fatalf("first sample's CPU: %.2f%%, want 20%%", m.CPUUsedPct)
	}
	// Within a second of the last: the same sample again.
	if again, n := lastSample(t, c); n != 1 || again != m {
		t.Fatalf("a sample within the gap: %d samples, %+v", n, again)
	}
	// 7 s more of CPU over the next 10 s: more than the half CPU allows
	// (the cgroup's counter is not trusted): 100 %.
	writeFiles(t, dir, map[string]string{"cpuacct/cpuacct.usage": "8000000000\n"})
	backdate(srv, 10*time.Second)
	if m, n = lastSample(t, c); n != 2 || m.CPUUsedPct != 100 {
		t.Fatalf("second sample (%d): %.2f%%", n, m.CPUUsedPct)
	}
	writeFiles(t, dir, map[string]string{"cpuacct/cpuacct.usage": "9000000000\n"})
	backdate(srv, 10*time.Second)
	if m, _ = lastSample(t, c); m.CPUUsedPct < 19.5 || m.CPUUsedPct > 20 {
		t.Fatalf("third sample: %.2f%%, want 20%%", m.CPUUsedPct)
	}
	// The samples kept are bounded.
	for range providers.MaxMetrics + 5 {
		backdate(srv, 2*time.Second)
		lastSample(t, c)
	}
	if _, n = lastSample(t, c); n != providers.MaxMetrics {
		t.Fatalf("%d samples kept, want %d", n, providers.MaxMetrics)
	}
}

func TestMetricsCgroupV2(t *testing.T) {
	dir := t.TempDir()
	const mib = 1 << 20
	writeFiles(t, dir, map[string]string{
		"cpu.stat":       "usage_usec 2000000\nuser_usec 1500000\nsystem_usec 500000\n",
		"memory.current": strconv.Itoa(64*mib) + "\n",
		"memory.stat":    "anon 1\nfile " + strconv.Itoa(16*mib) + "\ninactive_file " + strconv.Itoa(8*mib) + "\n",
		"memory.max":     "max\n",
		"cpu.max":        "max 100000\n",
	})
	srv, c := meterPair(t, openCgroupV2(dir))
	backdate(srv, 10*time.Second)
	m, _ := lastSample(t, c)
	host := readMemInfo()
	want := 100 * 2 / (10 * float64(runtime.NumCPU()))
	if m.MemUsed != 56*mib || m.MemCache != 16*mib || m.MemTotal != host.total || m.CPUCount != runtime.NumCPU() ||
		m.CPUUsedPct < want*0.97 || m.CPUUsedPct > want {
		t.Fatalf("sample: %+v (want %.2f%% CPU, host memory %d)", m, want, host.total)
	}
}

// BenchmarkMetrics: one metrics call that takes a sample (the agent's
// own cgroup, statfs), beside one answered from the last sample (within
// the gap), and a stat call for scale.
func BenchmarkMetrics(b *testing.B) {
	srv, c := pair(b)
	ctx := context.Background()
	b.Run("sample", func(b *testing.B) {
		for b.Loop() {
			srv.meter.mu.Lock()
			srv.meter.ring = srv.meter.ring[:0]
			srv.meter.mu.Unlock()
			if _, err := c.Metrics(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.Metrics(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("stat", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.StatFile(ctx, "/"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
