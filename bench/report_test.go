package main

import (
	"strings"
	"testing"
)

// TestRatioWords: a gateway ten times quicker and one ten times lower in
// throughput are not both "faster".
func TestRatioWords(t *testing.T) {
	rep := &Report{Results: []Result{
		compare("exec true", "docker", "ms", Series{P50: 5}, &Series{Label: "docker exec", P50: 100}),
		compare("pipe output throughput", "docker", "MB/s", Series{P50: 20}, &Series{Label: "a pipe", P50: 300}),
	}}
	var b strings.Builder
	rep.table(&b)
	for _, want := range []string{"| 0.05 (20x faster) |", "| 0.067 (15x slower) |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
