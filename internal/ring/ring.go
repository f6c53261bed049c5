// Package ring is the retained output of a terminal session: the last
// bytes of a stream, numbered by their absolute offsets.
package ring

import "slices"

// minRingAlloc is the first allocation of a ring: an idle shell's prompt
// fits, and 1,000 idle sessions cost about 1 MiB.
const minRingAlloc = 1 << 10

// Ring retains the last Max bytes written to it and numbers every byte with
// its absolute offset in the stream (the first byte written is offset 0).
// Its memory grows on demand, doubling, up to Max: a session with little
// output costs little.
//
// A Ring is not safe for concurrent use; an agent session guards its ring with
// its own lock.
type Ring struct {
	buf   []byte // circular; len(buf) is the current allocation (<= max)
	head  int    // index in buf of the oldest retained byte
	n     int    // bytes retained
	max   int
	total int64 // bytes ever written: the offset of the next byte
}

// New returns an empty ring that retains at most max bytes (max >= 1).
func New(max int) *Ring {
	if max < 1 {
		max = 1
	}
	return &Ring{max: max}
}

// Total is the number of bytes ever written: the absolute offset of the
// next byte.
func (r *Ring) Total() int64 { return r.total }

// Start is the absolute offset of the oldest retained byte (Total when the
// ring is empty).
func (r *Ring) Start() int64 { return r.total - int64(r.n) }

// Len is the number of bytes retained.
func (r *Ring) Len() int { return r.n }

// Write appends p, dropping the oldest bytes beyond the cap. It never
// fails and never keeps p.
func (r *Ring) Write(p []byte) {
	if len(p) == 0 {
		return
	}
	r.total += int64(len(p))
	if len(p) >= r.max {
		r.grow(r.max)
		copy(r.buf, p[len(p)-r.max:])
		r.head, r.n = 0, r.max
		return
	}
	if need := r.n + len(p); need > len(r.buf) && len(r.buf) < r.max {
		c := max(len(r.buf), minRingAlloc)
		for c < need {
			c *= 2
		}
		r.grow(min(c, r.max))
	}
	// Write at the tail, wrapping; whatever overruns len(buf) evicts the
	// oldest bytes.
	tail := (r.head + r.n) % len(r.buf)
	k := copy(r.buf[tail:], p)
	copy(r.buf, p[k:])
	if over := r.n + len(p) - len(r.buf); over > 0 {
		r.head = (r.head + over) % len(r.buf)
		r.n = len(r.buf)
	} else {
		r.n += len(p)
	}
}

// grow reallocates buf to size c (>= n), with the retained bytes first.
func (r *Ring) grow(c int) {
	if c == len(r.buf) {
		return
	}
	nb := make([]byte, c)
	r.copyOut(nb, r.head, r.n)
	r.buf, r.head = nb, 0
}

// copyOut copies n retained bytes starting at buffer index i into dst.
func (r *Ring) copyOut(dst []byte, i, n int) {
	if n == 0 {
		return
	}
	k := copy(dst[:n], r.buf[i:])
	copy(dst[k:n], r.buf)
}

// AppendSince appends to dst the retained bytes from absolute offset since
// to Total and returns the extended slice and the offset of its first
// appended byte. A since older than Start is clamped up to Start; a since
// at or past Total appends nothing (and returns Total).
func (r *Ring) AppendSince(dst []byte, since int64) ([]byte, int64) {
	start := r.Start()
	if since < start {
		since = start
	}
	if since >= r.total {
		return dst, r.total
	}
	skip := int(since - start)
	n := r.n - skip
	l := len(dst)
	dst = slices.Grow(dst, n)[:l+n]
	r.copyOut(dst[l:], (r.head+skip)%len(r.buf), n)
	return dst, since
}
