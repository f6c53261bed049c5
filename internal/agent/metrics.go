package agent

import (
	"bytes"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// The metrics op reports the sandbox's resource use as E2B's envd does:
// CPU, memory and disk, read inside the sandbox (its cgroup, statfs of
// its root). Samples are taken when the gateway asks, never in the
// background: a sandbox nobody asks about costs nothing, and each answer
// ends with a sample of now. The CPU share of a sample is the average
// over the time since the sample before (for the first, since the agent
// started), so it needs no second reading a moment later. The last
// providers.MaxMetrics samples are kept; a sample less than
// minMetricsGap after the last one is not taken (the last one answers).

// minMetricsGap is the least time between two samples.
const minMetricsGap = time.Second

// Cgroup is a sandbox's cgroup as the metrics op reads it: its files,
// opened once (a local sandbox's init opens them before its root stops
// being the host's). A file that is missing is nil; Close closes them.
type Cgroup struct {
	v2 bool
	// cgroup v2: cpu.stat, memory.current, memory.stat, memory.max,
	// cpu.max. v1: cpuacct.usage, memory.usage_in_bytes, memory.stat,
	// memory.limit_in_bytes, cpu.cfs_quota_us (and cfsPeriod).
	cpu, mem, memStat, memMax, cpuMax, cfsPeriod *os.File
}

// OpenCgroupV1 opens the cgroup v1 files of the controllers' directories
// in dirs (controller name → directory: memory, cpu, cpuacct).
func OpenCgroupV1(dirs map[string]string) *Cgroup {
	open := func(ctrl, name string) *os.File {
		if dirs[ctrl] == "" {
			return nil
		}
		f, _ := os.Open(dirs[ctrl] + "/" + name)
		return f
	}
	cpu := open("cpuacct", "cpuacct.usage")
	if cpu == nil {
		cpu = open("cpu", "cpuacct.usage") // cpu and cpuacct are one hierarchy
	}
	return &Cgroup{
		cpu:       cpu,
		mem:       open("memory", "memory.usage_in_bytes"),
		memStat:   open("memory", "memory.stat"),
		memMax:    open("memory", "memory.limit_in_bytes"),
		cpuMax:    open("cpu", "cpu.cfs_quota_us"),
		cfsPeriod: open("cpu", "cpu.cfs_period_us"),
	}
}

// openOwnCgroup opens the cgroup the agent sees at /sys/fs/cgroup (a
// container's own): cgroup v2's unified hierarchy, else v1's controllers.
func openOwnCgroup() *Cgroup {
	const root = "/sys/fs/cgroup"
	if _, err := os.Stat(root + "/cgroup.controllers"); err != nil {
		return OpenCgroupV1(map[string]string{"memory": root + "/memory", "cpu": root + "/cpu", "cpuacct": root + "/cpuacct"})
	}
	return openCgroupV2(root)
}

// openCgroupV2 opens the cgroup v2 files of the cgroup at dir.
func openCgroupV2(dir string) *Cgroup {
	open := func(name string) *os.File {
		f, _ := os.Open(dir + "/" + name)
		return f
	}
	return &Cgroup{v2: true, cpu: open("cpu.stat"), mem: open("memory.current"), memStat: open("memory.stat"),
		memMax: open("memory.max"), cpuMax: open("cpu.max")}
}

// Close closes the files.
func (g *Cgroup) Close() {
	for _, f := range []*os.File{g.cpu, g.mem, g.memStat, g.memMax, g.cpuMax, g.cfsPeriod} {
		if f != nil {
			f.Close()
		}
	}
}

// rawSample is what one sample reads.
type rawSample struct {
	at       time.Time
	cpuNS    int64   // the sandbox's CPU time so far
	cpus     float64 // the CPUs it may use
	memUsed  int64
	memCache int64
	memTotal int64
}

// read takes a raw sample; buf is scratch space.
func (g *Cgroup) read(buf []byte, hostMem memInfo) rawSample {
	s := rawSample{at: time.Now(), cpus: float64(runtime.NumCPU()), cpuNS: -1, memUsed: -1, memTotal: hostMem.total}
	if b := readAt(g.cpu, buf); b != nil {
		if g.v2 {
			if us, ok := field(b, "usage_usec"); ok {
				s.cpuNS = us * 1000
			}
		} else if ns, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil {
			s.cpuNS = ns
		}
	}
	if b := readAt(g.mem, buf); b != nil {
		if n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil {
			s.memUsed = n
		}
	}
	if s.memUsed >= 0 {
		// Used leaves out the page cache the kernel would drop first (as
		// docker stats does); tmpfs files and anonymous memory stay in.
		cacheField, inactiveField := "total_cache", "total_inactive_file"
		if g.v2 {
			cacheField, inactiveField = "file", "inactive_file"
		}
		if b := readAt(g.memStat, buf); b != nil {
			if n, ok := field(b, cacheField); ok {
				s.memCache = n
			}
			if n, ok := field(b, inactiveField); ok && n > 0 {
				s.memUsed -= min(n, s.memUsed)
			}
		}
		if b := readAt(g.memMax, buf); b != nil {
			// "max" (v2) or a huge number (v1) is no limit.
			if n, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil && n > 0 && n < s.memTotal {
				s.memTotal = n
			}
		}
	} else {
		// No memory cgroup: the host's figures.
		s.memUsed, s.memCache = hostMem.total-hostMem.available, hostMem.cached
	}
	var quota, period int64
	if b := readAt(g.cpuMax, buf); b != nil {
		f := bytes.Fields(b)
		if len(f) > 0 {
			quota, _ = strconv.ParseInt(string(f[0]), 10, 64) // "max" fails: no limit
		}
		if len(f) > 1 {
			period, _ = strconv.ParseInt(string(f[1]), 10, 64)
		}
	}
	if b := readAt(g.cfsPeriod, buf); b != nil {
		period, _ = strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	}
	if quota > 0 && period > 0 {
		s.cpus = min(s.cpus, float64(quota)/float64(period))
	}
	if s.cpuNS < 0 {
		s.cpuNS = rusageCPU()
	}
	s.memUsed = min(max(s.memUsed, 0), s.memTotal)
	s.memCache = min(max(s.memCache, 0), s.memTotal)
	return s
}

// rusageCPU is the CPU time of the agent and of the children it waited
// for: the sandbox's, where no cgroup accounts for it (processes that
// still run are not in it yet).
func rusageCPU() int64 {
	var ns int64
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			ns += ru.Utime.Nano() + ru.Stime.Nano()
		}
	}
	return ns
}

// readAt reads the whole of f (a cgroup file, generated anew at offset
// 0) into buf; nil when f is nil or unreadable.
func readAt(f *os.File, buf []byte) []byte {
	if f == nil {
		return nil
	}
	n, err := f.ReadAt(buf, 0)
	if n == 0 && err != nil {
		return nil
	}
	return buf[:n]
}

// field is the value of the line "name value" in b.
func field(b []byte, name string) (int64, bool) {
	for line := range bytes.Lines(b) {
		f := bytes.Fields(line)
		if len(f) >= 2 && string(f[0]) == name {
			n, err := strconv.ParseInt(string(f[1]), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// memInfo is the host's memory as /proc/meminfo tells it, in bytes.
type memInfo struct{ total, available, cached int64 }

func readMemInfo() memInfo {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return memInfo{total: maxMetricMem}
	}
	b = bytes.ReplaceAll(b, []byte(":"), nil)
	kb := func(name string) int64 {
		n, _ := field(b, name)
		return n << 10
	}
	m := memInfo{total: kb("MemTotal"), available: kb("MemAvailable"), cached: kb("Cached")}
	if m.total <= 0 {
		m.total = maxMetricMem
	}
	return m
}

// maxMetricMem stands in for the host's memory when it cannot be read.
const maxMetricMem = 1 << 50

// meter keeps a server's metric samples (see the top of this file).
type meter struct {
	start time.Time // the agent's start
	root  string    // the sandbox's root, for statfs
	open  func() *Cgroup

	mu   sync.Mutex // guards what follows
	cg   *Cgroup    // Options.Cgroup, else opened at the first sample
	buf  []byte
	last rawSample
	ring []providers.Metrics
}

// sample takes a sample unless the last is less than minMetricsGap old,
// and returns a copy of the retained ones.
func (m *meter) sample() []providers.Metrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.ring); n > 0 && time.Since(m.ring[n-1].Time) < minMetricsGap {
		return append([]providers.Metrics(nil), m.ring...)
	}
	if m.cg == nil {
		m.cg = m.open()
	}
	if m.buf == nil {
		m.buf = make([]byte, 16<<10)
	}
	raw := m.cg.read(m.buf, readMemInfo())
	prev := m.last
	if prev.at.IsZero() {
		prev = rawSample{at: m.start}
	}
	m.last = raw
	out := providers.Metrics{
		Time:     raw.at.UTC(),
		CPUCount: max(1, int(math.Ceil(raw.cpus))),
		MemUsed:  raw.memUsed, MemCache: raw.memCache, MemTotal: raw.memTotal,
	}
	if wall := raw.at.Sub(prev.at); wall > 0 && raw.cpus > 0 {
		pct := 100 * float64(raw.cpuNS-prev.cpuNS) / (float64(wall) * raw.cpus)
		out.CPUUsedPct = math.Round(min(max(pct, 0), 100)*100) / 100
	}
	var st unix.Statfs_t
	if unix.Statfs(m.root, &st) == nil && st.Bsize > 0 {
		bs := uint64(st.Bsize)
		out.DiskTotal = int64(min(st.Blocks*bs, 1<<60))
		out.DiskUsed = int64(min((st.Blocks-min(st.Bfree, st.Blocks))*bs, 1<<60))
	}
	if len(m.ring) == providers.MaxMetrics {
		m.ring = append(m.ring[:0], m.ring[1:]...)
	}
	m.ring = append(m.ring, out)
	return append([]providers.Metrics(nil), m.ring...)
}

// close closes the cgroup's files.
func (m *meter) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cg != nil {
		m.cg.Close()
	}
}
