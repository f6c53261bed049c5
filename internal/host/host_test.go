package host

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDefaultPidsMax: the default process limit is a real limit on every
// host, however large its pid_max, and never below what a shell needs.
func TestDefaultPidsMax(t *testing.T) {
	for procs, want := range map[int64]int64{
		32768:   2048,
		4194304: 4096,
		192735:  4096,
		512:     64,
		0:       64,
	} {
		if got := DefaultPidsMax(procs); got != want {
			t.Errorf("DefaultPidsMax(%d) = %d, want %d", procs, got, want)
		}
	}
}

// TestHostFigures: what this machine reports is sane: positive, and no
// more than any machine this runs on could have.
func TestHostFigures(t *testing.T) {
	if n := Procs(); n <= 0 || n > 1<<22 {
		t.Errorf("Procs() = %d", n)
	}
	if mem, err := MemoryMiB(); err != nil || mem < 64 || mem > 64<<20 {
		t.Errorf("MemoryMiB() = %d, %v", mem, err)
	}
	if n := CPUs(); n < 1 || n > 1<<14 {
		t.Errorf("CPUs() = %d", n)
	}
	if g, err := FreeDiskGiB(t.TempDir()); err != nil || g <= 0 || g > 1<<30 {
		t.Errorf("FreeDiskGiB(temp dir) = %g, %v", g, err)
	}
	if _, err := FreeDiskGiB("/no/such/dir"); err == nil {
		t.Error("FreeDiskGiB of a missing dir: no error")
	}
}
