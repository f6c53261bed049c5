package e2b

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// metricReply is one sample as E2B's API describes it (SandboxMetric).
type metricReply struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics answers GET /sandboxes/{id}/metrics (the SDKs' getMetrics):
// the samples the sandbox retains within start..end (Unix seconds, both
// optional), the last one taken now; see sandbox.Service.Metrics.
func (s *server) metrics(w http.ResponseWriter, r *http.Request) {
	var bad providers.InvalidFields
	bound := func(name string) time.Time {
		v := r.URL.Query().Get(name)
		if v == "" {
			return time.Time{}
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil || sec < 0 || sec > 1<<40 {
			bad = append(bad, providers.FieldError{Field: name, Message: "must be a Unix time in seconds"})
			return time.Time{}
		}
		return time.Unix(sec, 0)
	}
	start, end := bound("start"), bound("end")
	if len(bad) > 0 {
		s.writeError(w, r, bad)
		return
	}
	if !end.IsZero() {
		end = end.Add(time.Second - 1) // the SDK rounds to the second: its whole second counts
	}
	ms, err := s.svc.Metrics(r.Context(), apiCaller(r), r.PathValue("id"), start, end)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]metricReply, len(ms))
	for i, m := range ms {
		out[i] = metricReply{Timestamp: m.Time, TimestampUnix: m.Time.Unix(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
	}
	writeJSON(w, http.StatusOK, out)
}
