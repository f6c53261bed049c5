package sandbox

import "sync"

// minExecOutput is the least an exec keeps per stream, however little of
// the output budget is left: enough for an error message and a traceback.
const minExecOutput = 64 << 10

// outputBudget bounds the exec output the gateway holds at once, from the
// provider's capture until the reply has been written. Each exec reserves
// room for two full streams when it starts (its capture may grow that
// far), keeps only what its output holds once the provider returns, and
// gives that back when its result is released. Only the floor
// (minExecOutput per stream) may overdraw the budget, so it is exceeded
// by at most 2*minExecOutput per exec in flight (MaxExecs bounds those).
type outputBudget struct {
	mu    sync.Mutex // guards used and every reservation's held
	total int64
	used  int64
}

// reservation is one exec's room in an outputBudget.
type reservation struct {
	b    *outputBudget
	held int64
}

// reserve takes room for two streams of up to perStream bytes each. When
// less is left, the exec gets half of what is left per stream, but never
// less than minExecOutput (or perStream, if that is smaller). It returns
// the cap per stream granted and the reservation.
func (b *outputBudget) reserve(perStream int) (int, *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	got := int64(perStream)
	if left := b.total - b.used; 2*got > left {
		got = max(left/2, min(minExecOutput, got))
	}
	b.used += 2 * got
	return int(got), &reservation{b: b, held: 2 * got}
}

// keep shrinks the reservation to n bytes; it never grows it.
func (r *reservation) keep(n int64) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if n < r.held {
		r.b.used -= r.held - n
		r.held = n
	}
}

// release gives the whole reservation back; calling it again does nothing.
func (r *reservation) release() { r.keep(0) }

// inUse returns the bytes reserved now.
func (b *outputBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}
