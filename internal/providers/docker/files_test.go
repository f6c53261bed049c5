package docker

import (
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// noise is an endless deterministic byte stream of unknown length (no Len,
// no Seek), like an HTTP request body.
type noise struct{ r *rand.ChaCha8 }

func (n noise) Read(p []byte) (int, error) { return n.r.Read(p) }

// heapPeak samples the heap until stop is called and returns the peak,
// from a collected heap: the tests before may have left garbage, and a
// next collection far away, that would be counted with the caller's.
func heapPeak() (stop func() uint64) {
	runtime.GC()
	var peak uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak
	}
}

// TestLargeFile streams 1 GiB in and out with a bounded heap.
func TestLargeFile(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB round trip")
	}
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	const size = 1 << 30
	ctx := ctxFor(t, 3*time.Minute)

	stop := heapPeak()
	in := sha256.New()
	src := io.TeeReader(io.LimitReader(noise{rand.NewChaCha8([32]byte{7})}, size), in)
	n, err := p.WriteFile(ctx, id, "/data/big/blob.bin", src)
	if err != nil || n != size {
		t.Fatalf("WriteFile: %d %v", n, err)
	}
	rc, got, err := p.ReadFile(ctx, id, "/data/big/blob.bin")
	if err != nil || got != size {
		t.Fatalf("ReadFile: %d %v", got, err)
	}
	out := sha256.New()
	m, err := io.Copy(out, rc)
	rc.Close()
	peak := stop()
	if err != nil || m != size || string(in.Sum(nil)) != string(out.Sum(nil)) {
		t.Fatalf("read back %d bytes (%v); digest match %v", m, err, string(in.Sum(nil)) == string(out.Sum(nil)))
	}
	t.Logf("1 GiB round trip, heap peak %d MiB", peak>>20)
	if peak > 128<<20 {
		t.Errorf("heap peaked at %d MiB moving 1 GiB", peak>>20)
	}
	// stat, not wc: busybox's wc reads the whole file, which took over
	// 30 s on the loaded 2-core machine, on either transport.
	if res := run(t, p, id, "stat -c %s /data/big/blob.bin; rm /data/big/blob.bin"); strings.TrimSpace(string(res.Stdout)) != "1073741824" {
		t.Errorf("size inside: %q %q %d", res.Stdout, res.Stderr, res.ExitCode)
	}
}
