package providertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// testMetrics: a sample of now, with sane figures, and the figures move
// with what the sandbox does: memory a process holds, a file written, a
// process that burns CPU.
func (s *suite) testMetrics(t *testing.T, mr providers.MetricsReader, id string) {
	last := func() providers.Metrics {
		t.Helper()
		ms, err := mr.Metrics(ctxT(t, opTimeout), id)
		if err != nil {
			t.Fatalf("Metrics: %v", err)
		}
		if err := providers.CheckMetrics(ms); err != nil || len(ms) == 0 {
			t.Fatalf("Metrics: %d samples: %v", len(ms), err)
		}
		return ms[len(ms)-1]
	}
	m0 := last()
	if d := time.Since(m0.Time); d < -time.Minute || d > time.Minute || m0.MemTotal <= 0 || m0.DiskTotal <= 0 || m0.MemUsed <= 0 {
		t.Fatalf("first sample: %+v", m0)
	}

	const size = 64 << 20
	mk := newMarker()
	s.run(t, id, providers.ExecRequest{PreserveBackground: true,
		Command: fmt.Sprintf("(head -c %d /dev/zero; %s) | tail -c %d >/dev/null 2>&1 &", size, mk.sleep(), size)})
	eventually(t, "memory used grows by the 64 MiB a process holds", func() (bool, string) {
		m := last()
		return m.MemUsed >= m0.MemUsed+size*3/4, fmt.Sprintf("%d then %d", m0.MemUsed, m.MemUsed)
	})
	s.sh(t, id, mk.kill())

	s.sh(t, id, fmt.Sprintf("head -c %d /dev/zero > /workspace/metrics.bin && sync", size))
	eventually(t, "disk used grows by a 64 MiB file", func() (bool, string) {
		m := last()
		return m.DiskUsed >= m0.DiskUsed+size/2, fmt.Sprintf("%d then %d", m0.DiskUsed, m.DiskUsed)
	})
	s.sh(t, id, "rm -f /workspace/metrics.bin")

	pid := strings.TrimSpace(string(s.run(t, id, providers.ExecRequest{PreserveBackground: true,
		Command: "sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!"}).Stdout))
	t.Cleanup(func() { s.run(t, id, providers.ExecRequest{Command: "kill -9 " + pid}) })
	eventually(t, "CPU used reaches a quarter of a CPU while a process spins", func() (bool, string) {
		m := last()
		return m.CPUUsedPct >= 25/float64(m.CPUCount), fmt.Sprintf("%.2f%% of %d CPUs", m.CPUUsedPct, m.CPUCount)
	})
	t.Logf("first sample %+v; last %+v", m0, last())
}
