package main

import (
	"io"
	"testing"
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
