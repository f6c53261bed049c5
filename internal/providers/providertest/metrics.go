package providertest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
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

	// next is the first sample taken after prev (a second after it).
	next := func(prev providers.Metrics) providers.Metrics {
		t.Helper()
		var m providers.Metrics
		eventually(t, "a new sample", func() (bool, string) {
			m = last()
			return m.Time.After(prev.Time), m.Time.String()
		})
		return m
	}

	// A process that holds 64 MiB and one that spins, side by side; then
	// a 64 MiB file, written and removed, seen in the samples before,
	// between and after (the disk may be the host's, shared with others
	// who write and remove too: a try that others' changes blur is
	// tried again, for up to a minute and a half: a rehearsal's cold
	// build, writing its cache beside docker's sandboxes, blurred every
	// try of 20 s).
	const size = 64 << 20
	mk := newMarker()
	pid := strings.TrimSpace(string(s.run(t, id, providers.ExecRequest{PreserveBackground: true, Command: fmt.Sprintf(
		"(head -c %d /dev/zero; %s) | tail -c %d >/dev/null 2>&1 & sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!",
		size, mk.sleep(), size)}).Stdout))
	t.Cleanup(func() {
		s.run(t, id, providers.ExecRequest{Command: "kill -9 " + pid + "; rm -f /workspace/metrics.bin; " + mk.kill()})
	})
	// A tenth of a CPU: the spinner's share on a loaded machine.
	eventually(t, "memory used grows by the 64 MiB a process holds, CPU used while a process spins", func() (bool, string) {
		m := last()
		return m.MemUsed >= m0.MemUsed+size*3/4 && m.CPUUsedPct >= 10/float64(m.CPUCount),
			fmt.Sprintf("memory %d then %d, CPU %.2f%% of %d", m0.MemUsed, m.MemUsed, m.CPUUsedPct, m.CPUCount)
	})
	s.sh(t, id, "kill -9 "+pid+"; "+mk.kill())
	prev := last()
	testkit.EventuallyNil(t, "disk used moves with a 64 MiB file", 90*time.Second, func() error {
		a := next(prev)
		s.sh(t, id, fmt.Sprintf("head -c %d /dev/zero > /workspace/metrics.bin && sync", size))
		b := next(a)
		s.sh(t, id, "rm /workspace/metrics.bin && sync")
		prev = next(b)
		if b.DiskUsed-a.DiskUsed < size/2 || b.DiskUsed-prev.DiskUsed < size/2 {
			return fmt.Errorf("disk %d, %d with the file, %d without", a.DiskUsed, b.DiskUsed, prev.DiskUsed)
		}
		return nil
	})
	t.Logf("first sample %+v; last %+v", m0, last())
}
