package ring

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// model is the plain-slice reference: everything ever written.
type model struct{ all []byte }

func (m *model) since(max int, since int64) ([]byte, int64) {
	total := int64(len(m.all))
	start := max64(0, total-int64(max))
	if since < start {
		since = start
	}
	if since >= total {
		return nil, total
	}
	return m.all[since:], since
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func check(t *testing.T, r *Ring, m *model, max int, since int64) {
	t.Helper()
	got, goff := r.AppendSince(nil, since)
	want, woff := m.since(max, since)
	if goff != woff || !bytes.Equal(got, want) {
		t.Fatalf("since %d: got offset %d, %d bytes; want offset %d, %d bytes (total %d)", since, goff, len(got), woff, len(want), len(m.all))
	}
	if r.Total() != int64(len(m.all)) {
		t.Fatalf("total %d, want %d", r.Total(), len(m.all))
	}
}

func pattern(from, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((from + i) % 251)
	}
	return b
}

// TestRingSizes writes n-1, n, n+1 and 2n bytes into rings of cap n, in
// one write and byte by byte, and reads back from every interesting offset.
func TestRingSizes(t *testing.T) {
	for _, n := range []int{1, 7, minRingAlloc, minRingAlloc + 3, 3 * minRingAlloc, 1 << 20} {
		for _, size := range []int{n - 1, n, n + 1, 2 * n} {
			for _, chunked := range []bool{false, true} {
				if chunked && n > 4*minRingAlloc {
					continue
				}
				r, m := New(n), &model{}
				data := pattern(0, size)
				if chunked {
					for i := range data {
						r.Write(data[i : i+1])
						m.all = append(m.all, data[i])
					}
				} else {
					r.Write(data)
					m.all = append(m.all, data...)
				}
				total := int64(size)
				for _, since := range []int64{0, 1, total - int64(n) - 1, total - int64(n), total - int64(n) + 1, total - 1, total, total + 1, -5} {
					check(t, r, m, n, since)
				}
				if want := min(size, n); r.Len() != want {
					t.Fatalf("cap %d, wrote %d: retains %d, want %d", n, size, r.Len(), want)
				}
			}
		}
	}
}

// TestRingGrowsOnDemand: a ring that saw little output holds little memory.
func TestRingGrowsOnDemand(t *testing.T) {
	r := New(1 << 20)
	r.Write([]byte("$ "))
	if len(r.buf) != minRingAlloc {
		t.Fatalf("allocated %d bytes for 2 bytes of output", len(r.buf))
	}
	r.Write(make([]byte, 5000))
	if len(r.buf) != 8192 {
		t.Fatalf("allocated %d bytes for 5002 bytes of output, want 8192", len(r.buf))
	}
	r.Write(make([]byte, 3<<20))
	if len(r.buf) != 1<<20 {
		t.Fatalf("allocated %d bytes, want the cap", len(r.buf))
	}
}

// TestRingRandom checks random writes and reads against the model.
func TestRingRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 200; iter++ {
		n := 1 + rng.IntN(5000)
		r, m := New(n), &model{}
		for w := 0; w < 100; w++ {
			var k int
			switch rng.IntN(4) {
			case 0:
				k = rng.IntN(3)
			case 1:
				k = rng.IntN(n + 2)
			case 2:
				k = n - 1 + rng.IntN(3)
			default:
				k = rng.IntN(3 * n)
			}
			p := pattern(len(m.all), k)
			r.Write(p)
			m.all = append(m.all, p...)
			total := int64(len(m.all))
			check(t, r, m, n, rng.Int64N(total+2)-1)
			check(t, r, m, n, total-int64(n))
		}
	}
}
