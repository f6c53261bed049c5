package sandbox

import "sync"

// minExecOutput is the least an exec keeps per stream, however little of
// the output budget is left: enough for an error message and a traceback.
const minExecOutput = 64 << 10

// outputKeys is how many API keys may hold their whole output budget at
// once within the gateway-wide bound (see outputBudget).
const outputKeys = 4

// outputBudget bounds the exec output the gateway holds at once, from the
// provider's capture until the reply has been written: for each API key
// (the sandbox creator's; anonymous is one key) at perKey, and for all
// together at outputKeys × perKey. One key's replies that nobody reads
// thus shrink that key's later output, never another's: it takes
// outputKeys keys, each at its whole budget, to exhaust the gateway's,
// and stuck replies hold theirs only until the reply timeout cuts them.
//
// Each exec reserves room for two full streams when it starts (its
// capture may grow that far), keeps only what its output holds once the
// provider returns, and gives that back when its result is released. When
// less is left (of its key's budget or the gateway's, whichever is less)
// it gets half of that per stream, but never less than minExecOutput: the
// floor is the only overdraft, by at most 2*minExecOutput per exec in
// flight (MaxExecs bounds those).
type outputBudget struct {
	mu     sync.Mutex // guards used, byKey and every reservation's held
	perKey int64
	total  int64
	used   int64
	byKey  map[string]int64
}

func newOutputBudget(perKey int64) *outputBudget {
	return &outputBudget{perKey: perKey, total: perKey * outputKeys, byKey: map[string]int64{}}
}

// reservation is one exec's room in an outputBudget.
type reservation struct {
	b    *outputBudget
	key  string
	held int64
}

// reserve takes room for key's exec for two streams of up to perStream
// bytes each (see outputBudget). It returns the cap per stream granted
// and the reservation.
func (b *outputBudget) reserve(key string, perStream int) (int, *reservation) {
	b.mu.Lock()
	defer b.mu.Unlock()
	got := int64(perStream)
	if left := min(b.perKey-b.byKey[key], b.total-b.used); 2*got > left {
		got = max(left/2, min(minExecOutput, got))
	}
	b.used += 2 * got
	b.byKey[key] += 2 * got
	return int(got), &reservation{b: b, key: key, held: 2 * got}
}

// keep shrinks the reservation to n bytes; it never grows it.
func (r *reservation) keep(n int64) {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	if n < r.held {
		r.b.used -= r.held - n
		if r.b.byKey[r.key] -= r.held - n; r.b.byKey[r.key] <= 0 {
			delete(r.b.byKey, r.key)
		}
		r.held = n
	}
}

// release gives the whole reservation back; calling it again does nothing.
func (r *reservation) release() { r.keep(0) }

// inUse returns the bytes reserved now, in all.
func (b *outputBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// OutputInUse returns the bytes of exec output held now, in all: by
// commands running and by results not yet released.
func (s *Service) OutputInUse() int64 { return s.out.inUse() }
