package main

import (
	"io"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/host"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// TestMemoryLimitFlag: --memory-limit and its twin take bytes or a
// GOMEMLIMIT-style unit; anything else is refused at start-up.
func TestMemoryLimitFlag(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	for v, want := range map[string]byteSize{"1GiB": 1 << 30, "512MiB": 512 << 20, "64KiB": 64 << 10, "1TiB": 1 << 40, "1048576": 1 << 20, "4096B": 4096} {
		c, err := parseConfig([]string{"--memory-limit", v}, none, io.Discard)
		if err != nil || c.MemoryLimit != want {
			t.Errorf("--memory-limit %s: %d, %v; want %d", v, c.MemoryLimit, err, want)
		}
	}
	c, err := parseConfig(nil, none, io.Discard)
	if err != nil || c.MemoryLimit != 0 || c.MaxExecOutputTotal != 256<<20 {
		t.Fatalf("defaults: memory limit %d, exec output total %d, %v", c.MemoryLimit, c.MaxExecOutputTotal, err)
	}
	env := func(k string) (string, bool) {
		return map[string]string{"SANDGATE_MEMORY_LIMIT": "2GiB"}[k], k == "SANDGATE_MEMORY_LIMIT"
	}
	if c, err := parseConfig(nil, env, io.Discard); err != nil || c.MemoryLimit != 2<<30 {
		t.Fatalf("SANDGATE_MEMORY_LIMIT=2GiB: %d, %v", c.MemoryLimit, err)
	}
	for _, v := range []string{"1GB", "1.5GiB", "0", "-1", "lots", "GiB", "", "9999999TiB"} {
		if _, err := parseConfig([]string{"--memory-limit", v}, none, io.Discard); err == nil {
			t.Errorf("--memory-limit %q accepted", v)
		}
	}
	if _, err := parseConfig([]string{"--max-exec-output-total", "0"}, none, io.Discard); err == nil {
		t.Error("--max-exec-output-total 0 accepted")
	}
}

// TestCeilingFlags: the ceilings default to the host's figures (sane and
// above zero) and the fixed defaults; flags and their twins override them,
// 0 is none; bad values and a --pids-max over the process ceiling are
// refused at start-up.
func TestCeilingFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	dir := t.TempDir()
	resolve := func(args []string, lookup func(string) (string, bool)) (sandbox.Ceilings, int64, error) {
		t.Helper()
		c, err := parseConfig(args, lookup, io.Discard)
		if err != nil {
			return sandbox.Ceilings{}, 0, err
		}
		return c.Ceilings.resolve(dir, c.PidsMax)
	}
	got, pids, err := resolve(nil, none)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := host.MemoryMiB()
	if err != nil {
		t.Fatal(err)
	}
	free, err := host.FreeDiskGiB(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := sandbox.Ceilings{MemoryMiB: mem, CPU: float64(runtime.NumCPU()), DiskGiB: max(1, math.Floor(free)),
		TTL: 24 * time.Hour, EnvBytes: 64 << 10, MetadataBytes: 64 << 10, FilesBytes: 16 << 20, Files: 1024}
	// The free space may move by a GiB while the test runs.
	if math.Abs(got.DiskGiB-want.DiskGiB) <= 1 {
		got.DiskGiB = want.DiskGiB
	}
	if got != want || pids != host.DefaultPidsMax(host.Procs()) {
		t.Fatalf("defaults %+v pids %d; want %+v pids %d", got, pids, want, host.DefaultPidsMax(host.Procs()))
	}
	if got.MemoryMiB < 64 || got.CPU < 1 || got.DiskGiB < 1 || pids < 64 {
		t.Fatalf("host defaults not sane: %+v pids %d", got, pids)
	}
	t.Logf("this host's ceilings: %+v pids %d", got, pids)

	got, pids, err = resolve([]string{"--max-memory-mib", "512", "--max-cpu", "0.5", "--max-disk-gib", "0", "--max-pids", "100", "--max-ttl", "0",
		"--max-files-count", "0", "--pids-max", "100"}, func(k string) (string, bool) {
		v, ok := map[string]string{"SANDGATE_MAX_METADATA_BYTES": "10", "SANDGATE_MAX_CPU": "8"}[k]
		return v, ok
	})
	want = sandbox.Ceilings{MemoryMiB: 512, CPU: 0.5, EnvBytes: 64 << 10, MetadataBytes: 10, FilesBytes: 16 << 20}
	if err != nil || got != want || pids != 100 {
		t.Fatalf("set: %+v pids %d, %v; want %+v pids 100", got, pids, err, want)
	}
	// No process ceiling, or one above the host's, is the host's.
	for _, v := range []string{"0", "99999999"} {
		if _, pids, err := resolve([]string{"--max-pids", v}, none); err != nil || pids != host.Procs() {
			t.Errorf("--max-pids %s: %d, %v; want the host's %d", v, pids, err, host.Procs())
		}
	}
	for _, args := range [][]string{
		{"--max-memory-mib", "1.5"}, {"--max-memory-mib", "-1"}, {"--max-cpu", "NaN"}, {"--max-cpu", "Inf"}, {"--max-disk-gib", "lots"},
		{"--max-pids", "1e300"}, {"--max-env-bytes", "-1"}, {"--max-ttl", "-1s"}, {"--max-pids", "100", "--pids-max", "101"},
	} {
		if _, _, err := resolve(args, none); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}
