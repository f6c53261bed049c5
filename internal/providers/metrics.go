package providers

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Metrics is one sample of a sandbox's resource use, read inside the
// sandbox from its cgroup and its root filesystem (as E2B's envd reports
// them).
type Metrics struct {
	Time time.Time `json:"time"`
	// CPUCount is the CPUs the sandbox may use: its CPU limit rounded up,
	// else the CPUs its processes may run on.
	CPUCount int `json:"cpu_count"`
	// CPUUsedPct is the share of CPUCount's worth of CPU time the sandbox
	// used since the sample before (0..100).
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemUsed    int64   `json:"mem_used"`  // bytes, the page cache left out
	MemCache   int64   `json:"mem_cache"` // bytes of page cache
	MemTotal   int64   `json:"mem_total"` // the memory limit, else the host's memory
	DiskUsed   int64   `json:"disk_used"` // bytes used on the filesystem of /
	DiskTotal  int64   `json:"disk_total"`
}

// MaxMetrics bounds the samples a sandbox retains and reports.
const MaxMetrics = 60

// maxMetricBytes and maxMetricCPUs bound a sample's figures: anything
// larger is a lie of the sandbox's, not a machine.
const (
	maxMetricBytes = 1 << 60
	maxMetricCPUs  = 1 << 14
)

// MetricsReader is implemented by providers whose sandboxes can report
// their resource use.
type MetricsReader interface {
	// Metrics returns sandbox id's retained samples, oldest first, the
	// last one taken now (or within the last second). ErrConflict unless
	// the sandbox is running.
	Metrics(ctx context.Context, id string) ([]Metrics, error)
}

// CheckMetrics checks samples that came from inside a sandbox: at most
// MaxMetrics, in time order, every figure within its bounds. It returns
// what is wrong with the first sample that is not.
func CheckMetrics(ms []Metrics) error {
	if len(ms) > MaxMetrics {
		return fmt.Errorf("%d metric samples, at most %d", len(ms), MaxMetrics)
	}
	for i, m := range ms {
		bad := ""
		switch {
		case m.Time.IsZero() || m.Time.Year() > 9999:
			bad = "time"
		case i > 0 && m.Time.Before(ms[i-1].Time):
			bad = "time before the sample before"
		case m.CPUCount < 1 || m.CPUCount > maxMetricCPUs:
			bad = "cpu_count"
		case math.IsNaN(m.CPUUsedPct) || m.CPUUsedPct < 0 || m.CPUUsedPct > 100:
			bad = "cpu_used_pct"
		case !within(m.MemUsed, m.MemTotal) || !within(m.MemCache, maxMetricBytes):
			bad = "memory"
		case !within(m.DiskUsed, m.DiskTotal):
			bad = "disk"
		}
		if bad != "" {
			return fmt.Errorf("metric sample %d: %s out of bounds", i, bad)
		}
	}
	return nil
}

// within says 0 <= used <= total <= maxMetricBytes.
func within(used, total int64) bool {
	return used >= 0 && used <= total && total <= maxMetricBytes
}
