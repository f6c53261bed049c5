// Package metrics declares every Prometheus metric sandgate exports, in
// one place, on a Registerer the caller injects (a fresh registry in
// tests). Labels are low-cardinality by rule: a route pattern, a status
// code, an outcome or reason from a fixed set, a provider name — never a
// sandbox id, a session id or a raw path.
package metrics

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the collectors. Packages take a *Metrics in their
// options; Discard gives one whose values nobody reads.
type Metrics struct {
	reg prometheus.Registerer

	CreatesTotal   *prometheus.CounterVec // provider, outcome: ok | error | unavailable | refused (quota, budget)
	CreateSeconds  prometheus.Histogram
	DeletesTotal   *prometheus.CounterVec // reason: deleted | expired | idle
	ExecSeconds    prometheus.Histogram
	ExecTotal      *prometheus.CounterVec // outcome: ok | nonzero | timeout | sandbox | error
	PTYSessions    prometheus.Gauge
	PTYAttachments prometheus.Gauge
	PTYBytesTotal  *prometheus.CounterVec // direction: in | out
	PTYDropped     *prometheus.CounterVec // reason: slow | silent | taken_over | shutdown
	HTTPRequests   *prometheus.CounterVec // route, code
	HTTPSeconds    *prometheus.HistogramVec
	Refused        *prometheus.CounterVec // limit: exec | pty | body | frame
	PoolClaims     *prometheus.CounterVec // spec: a configured warm pool
	PoolMisses     *prometheus.CounterVec // spec
	// QuotaRefusals counts requests refused by a per-key quota or the
	// admission budget, by kind: sandboxes | memory_mib | disk_gib |
	// snapshots | snapshot_bytes (a key's quota); budget (could never
	// fit); budget_memory | budget_disk (waited the queue timeout for
	// room). Never labelled by key.
	QuotaRefusals *prometheus.CounterVec
}

// New creates the collectors and registers them, with the Go runtime and
// process collectors, on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reg: reg,
		CreatesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_sandbox_creates_total", Help: "Sandbox creates by provider and outcome.",
		}, []string{"provider", "outcome"}),
		CreateSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandgate_sandbox_create_seconds", Help: "Time to create a ready sandbox, queue wait excluded.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		DeletesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_sandbox_deletes_total", Help: "Sandboxes removed, by reason.",
		}, []string{"reason"}),
		ExecSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandgate_exec_seconds", Help: "Duration of one-shot execs.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 180},
		}),
		ExecTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_exec_total", Help: "One-shot execs by outcome.",
		}, []string{"outcome"}),
		PTYSessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandgate_pty_sessions", Help: "Terminal sessions held (running or exited, not yet deleted).",
		}),
		PTYAttachments: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandgate_pty_attachments", Help: "WebSocket clients attached to terminal sessions.",
		}),
		PTYBytesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_pty_bytes_total", Help: "Terminal bytes: out = process output, in = client input.",
		}, []string{"direction"}),
		PTYDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_pty_clients_dropped_total", Help: "Terminal clients the gateway closed, by reason.",
		}, []string{"reason"}),
		HTTPRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_http_requests_total", Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
		HTTPSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sandgate_http_request_seconds", Help: "HTTP request duration by route pattern.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_limit_refusals_total", Help: "Requests refused by a gateway limit.",
		}, []string{"limit"}),
		PoolClaims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_pool_claims_total", Help: "Creates served by a warm pool's ready sandbox, by pool spec.",
		}, []string{"spec"}),
		PoolMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_pool_misses_total", Help: "Creates matching a warm pool that found it empty, by pool spec.",
		}, []string{"spec"}),
		QuotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_quota_refusals_total", Help: "Creates and snapshots refused by a per-key quota or the admission budget, by kind.",
		}, []string{"kind"}),
	}
	reg.MustRegister(m.CreatesTotal, m.CreateSeconds, m.DeletesTotal, m.ExecSeconds, m.ExecTotal,
		m.PTYSessions, m.PTYAttachments, m.PTYBytesTotal, m.PTYDropped, m.HTTPRequests, m.HTTPSeconds, m.Refused,
		m.PoolClaims, m.PoolMisses, m.QuotaRefusals,
		// Besides the usual go_memstats_*, go_gc_heap_live_bytes: the heap
		// the last collection kept, the figure a leak shows in.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

// Discard returns metrics registered nowhere visible (for tests and for
// packages used without metrics).
func Discard() *Metrics { return New(prometheus.NewRegistry()) }

// WatchSandboxes registers the gauges read from the sandbox service at
// scrape time: sandgate_sandboxes{state} from states (state -> count) and
// sandgate_capacity_queue_waiting from waiting.
func (m *Metrics) WatchSandboxes(states func() map[string]int, waiting func() int) {
	m.reg.MustRegister(
		&stateCollector{states: states, desc: prometheus.NewDesc("sandgate_sandboxes", "Sandboxes by state.", []string{"state"}, nil)},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandgate_capacity_queue_waiting", Help: "Creates waiting for capacity.",
		}, func() float64 { return float64(waiting()) }),
	)
}

// WatchAdmission registers sandgate_committed_memory_bytes and
// sandgate_committed_disk_bytes, the memory and disk committed by all
// live sandboxes (committed returns them in MiB), read at scrape time.
func (m *Metrics) WatchAdmission(committed func() (memMiB, diskMiB int64)) {
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandgate_committed_memory_bytes", Help: "Memory committed by live sandboxes (their limits), gateway-wide.",
		}, func() float64 { mem, _ := committed(); return float64(mem) * (1 << 20) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sandgate_committed_disk_bytes", Help: "Disk committed by live sandboxes (their limits), gateway-wide.",
		}, func() float64 { _, disk := committed(); return float64(disk) * (1 << 20) }),
	)
}

// WatchPools registers sandgate_pool_ready{spec}, read from ready (pool
// spec -> ready sandboxes) at scrape time.
func (m *Metrics) WatchPools(ready func() map[string]int) {
	m.reg.MustRegister(&mapCollector{get: ready, desc: prometheus.NewDesc("sandgate_pool_ready", "Ready sandboxes in each warm pool.", []string{"spec"}, nil)})
}

type mapCollector struct {
	desc *prometheus.Desc
	get  func() map[string]int
}

func (c *mapCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *mapCollector) Collect(ch chan<- prometheus.Metric) {
	for k, v := range c.get() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), k)
	}
}

// States are the sandbox states, always reported (0 when none).
var States = []string{"starting", "running", "paused", "stopped", "error", "unknown"}

type stateCollector struct {
	desc   *prometheus.Desc
	states func() map[string]int
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.states()
	for _, st := range States {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n[st]), st)
	}
}
