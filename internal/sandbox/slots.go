package sandbox

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// demand is what one live sandbox holds of the gateway: a slot (of
// MaxSandboxes), its memory and its disk, on behalf of the API key that
// created it.
type demand struct {
	key     string // creator fingerprint ("" = anonymous)
	memMiB  int64
	diskMiB int64
}

// slots admits creates: at most max live sandboxes, their memory and disk
// within the admission budget, and each key within its quotas. A create
// that fits no slot or budget now waits in its key's FIFO queue; the
// queues are served fairly: a freed slot goes to the waiting key with the
// fewest live sandboxes (the oldest waiter among equals), so one key's
// batch can never keep another key waiting while it takes every slot that
// frees. Within one key the order is FIFO, and the one a key would serve
// next is never overtaken by a smaller create of another key that happens
// to fit (a large create is not starved).
type slots struct {
	mu     sync.Mutex // guards every field below and every keyUse
	max    int
	budget Budget
	quota  Quotas
	used   int   // live sandboxes holding a slot
	mem    int64 // MiB committed by them
	disk   int64 // MiB committed by them
	keys   map[string]*keyUse
	queued int    // waiters in all keys' queues
	seq    uint64 // arrival order of waiters
	// refused is told the quota (or budget) a create was refused for; nil
	// = nobody listens.
	refused func(kind string)
}

// keyUse is one key's share: what its live sandboxes hold, and its queue
// of creates waiting (with what they ask for, so that a key's queue never
// promises more than its quotas).
type keyUse struct {
	live        int
	mem, disk   int64     // MiB
	waiters     list.List // of *waiter
	qMem, qDisk int64     // MiB asked by the waiters
	vol         int64     // MiB of the key's volumes (its disk quota counts them)
}

type waiter struct {
	d   demand
	seq uint64
	ch  chan struct{} // closed when granted
}

func newSlots(max int) *slots {
	return &slots{max: max, keys: map[string]*keyUse{}}
}

func (s *slots) key(k string) *keyUse {
	u := s.keys[k]
	if u == nil {
		u = &keyUse{}
		s.keys[k] = u
	}
	return u
}

// tidy forgets key k's share once it holds and waits for nothing. s.mu held.
func (s *slots) tidy(k string) {
	if u := s.keys[k]; u != nil && u.live == 0 && u.waiters.Len() == 0 && u.vol == 0 {
		delete(s.keys, k)
	}
}

// take counts d as held without waiting or checking (adopted sandboxes;
// may go over max, the budget or a quota after a restart with lower
// limits).
func (s *slots) take(d demand) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold(d)
}

// hold counts d as held. s.mu held.
func (s *slots) hold(d demand) {
	u := s.key(d.key)
	u.live++
	u.mem += d.memMiB
	u.disk += d.diskMiB
	s.used++
	s.mem += d.memMiB
	s.disk += d.diskMiB
}

// waiting returns how many creates are queued.
func (s *slots) waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued
}

// acquire takes a slot and d's share of the budget for d.key, waiting in
// the key's queue up to timeout. It returns at once an ErrInvalid when d
// could never fit the budget, a *QuotaError (ErrTooMany) when d would take
// the key over a quota (counting what the key's queued creates ask for);
// after waiting, ErrUnavailable when the wait timed out, or ctx's error.
func (s *slots) acquire(ctx context.Context, d demand, timeout time.Duration) error {
	s.mu.Lock()
	if err := s.admissible(d, 1); err != nil {
		s.mu.Unlock()
		return err
	}
	s.seq++
	w := &waiter{d: d, seq: s.seq, ch: make(chan struct{})}
	u := s.key(d.key)
	el := u.waiters.PushBack(w)
	u.qMem += d.memMiB
	u.qDisk += d.diskMiB
	s.queued++
	s.dispatch()
	s.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	default:
	}

	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = s.timeoutError(d, timeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w.ch:
		// Granted while giving up: pass it on.
		s.free(d)
	default:
		s.unqueue(u, el)
	}
	// A waiter that blocked the others (the next to serve, too large for
	// what is free) is gone: the rest may fit now.
	s.dispatch()
	s.tidy(d.key)
	return err
}

// timeoutError says what a create waited for: a slot, or room in the
// memory or disk budget.
func (s *slots) timeoutError(d demand, waited time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.used >= s.max:
		return providers.Errorf(providers.ErrUnavailable, "at capacity (%d sandboxes): waited %s for a free slot", s.max, waited)
	case s.budget.MemoryMiB > 0 && s.mem+d.memMiB > s.budget.MemoryMiB:
		s.refuse("budget_memory")
		return providers.Errorf(providers.ErrUnavailable, "the gateway's memory budget is committed (%d of %d MiB; this create needs %d): waited %s", s.mem, s.budget.MemoryMiB, d.memMiB, waited)
	case s.budget.DiskMiB > 0 && s.disk+d.diskMiB > s.budget.DiskMiB:
		s.refuse("budget_disk")
		return providers.Errorf(providers.ErrUnavailable, "the gateway's disk budget is committed (%s of %s; this create needs %s): waited %s", gib(s.disk), gib(s.budget.DiskMiB), gib(d.diskMiB), waited)
	default:
		// Other keys' creates were served first (fair share).
		return providers.Errorf(providers.ErrUnavailable, "creates of other API keys were served first (fair share of %d sandboxes): waited %s", s.max, waited)
	}
}

// unqueue removes a waiter that was not granted. s.mu held.
func (s *slots) unqueue(u *keyUse, el *list.Element) {
	w := u.waiters.Remove(el).(*waiter)
	u.qMem -= w.d.memMiB
	u.qDisk -= w.d.diskMiB
	s.queued--
}

// admissible refuses n creates of d when one could never fit the budget,
// or when they would take their key over a quota. s.mu held.
func (s *slots) admissible(d demand, n int) error {
	var bad providers.InvalidFields
	if b := s.budget.MemoryMiB; b > 0 && d.memMiB > b {
		bad.Add("resources.memory_mib", "%d MiB is more than the gateway can ever admit: its memory budget is %d MiB (host memory × --overcommit)", d.memMiB, b)
	}
	if b := s.budget.DiskMiB; b > 0 && d.diskMiB > b {
		bad.Add("resources.disk_gib", "%s is more than the gateway can ever admit: its disk budget is %s (state dir filesystem × --disk-overcommit)", gib(d.diskMiB), gib(b))
	}
	if err := bad.Err(); err != nil {
		s.refuse("budget")
		return err
	}
	u := s.keys[d.key]
	if u == nil {
		u = &keyUse{}
	}
	q, n64 := s.quota, int64(n)
	switch {
	case q.Sandboxes > 0 && u.live+u.waiters.Len()+n > q.Sandboxes:
		return s.overQuota("sandboxes", fmt.Sprintf("%d sandboxes", q.Sandboxes),
			fmt.Sprintf("%d live and %d queued, %d asked", u.live, u.waiters.Len(), n))
	case q.MemoryMiB > 0 && u.mem+u.qMem+n64*d.memMiB > q.MemoryMiB:
		return s.overQuota("memory_mib", fmt.Sprintf("%d MiB of memory", q.MemoryMiB),
			fmt.Sprintf("%d MiB committed and queued, %d asked", u.mem+u.qMem, n64*d.memMiB))
	case q.DiskMiB > 0 && u.disk+u.qDisk+u.vol+n64*d.diskMiB > q.DiskMiB:
		return s.overQuota("disk_gib", fmt.Sprintf("%s of disk", gib(q.DiskMiB)),
			fmt.Sprintf("%s committed and queued, %s of volumes, %s asked", gib(u.disk+u.qDisk), gib(u.vol), gib(n64*d.diskMiB)))
	}
	return nil
}

// addVolume counts mib more (or, negative, less) of key's volumes. With
// check, a volume that would take the key over its disk quota is refused
// and not counted.
func (s *slots) addVolume(key string, mib int64, check bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.key(key)
	if q := s.quota.DiskMiB; check && q > 0 && u.disk+u.qDisk+u.vol+mib > q {
		s.tidy(key)
		return s.overQuota("disk_gib", fmt.Sprintf("%s of disk", gib(q)),
			fmt.Sprintf("%s committed and queued by sandboxes, %s of volumes, a volume of %s asked", gib(u.disk+u.qDisk), gib(u.vol), gib(mib)))
	}
	u.vol += mib
	s.tidy(key)
	return nil
}

// check refuses n creates of d at once, as acquire would refuse each (an
// all-or-nothing batch is refused whole before any is made).
func (s *slots) check(d demand, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admissible(d, n)
}

func (s *slots) overQuota(which, limit, usage string) error {
	s.refuse(which)
	return newQuotaError(which, fmt.Sprintf("quota exceeded: this API key may hold %s (%s); delete some first", limit, usage))
}

func (s *slots) refuse(kind string) {
	if s.refused != nil {
		s.refused(kind)
	}
}

// fits reports whether d fits what is free now. s.mu held.
func (s *slots) fits(d demand) bool {
	return s.used < s.max &&
		(s.budget.MemoryMiB <= 0 || s.mem+d.memMiB <= s.budget.MemoryMiB) &&
		(s.budget.DiskMiB <= 0 || s.disk+d.diskMiB <= s.budget.DiskMiB)
}

// dispatch grants waiters while the next one fits. The next is the head
// of the queue of the waiting key with the fewest live sandboxes, the
// oldest among equals. s.mu held.
func (s *slots) dispatch() {
	for s.queued > 0 {
		var next *keyUse
		var nw *waiter
		for _, u := range s.keys {
			el := u.waiters.Front()
			if el == nil {
				continue
			}
			w := el.Value.(*waiter)
			if next == nil || u.live < next.live || (u.live == next.live && w.seq < nw.seq) {
				next, nw = u, w
			}
		}
		if !s.fits(nw.d) {
			return
		}
		s.unqueue(next, next.waiters.Front())
		s.hold(nw.d)
		close(nw.ch)
	}
}

// release gives back what d held and serves the waiters that now fit.
func (s *slots) release(d demand) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free(d)
}

// free is release with s.mu held.
func (s *slots) free(d demand) {
	u := s.key(d.key)
	u.live--
	u.mem -= d.memMiB
	u.disk -= d.diskMiB
	s.used--
	s.mem -= d.memMiB
	s.disk -= d.diskMiB
	s.dispatch()
	s.tidy(d.key)
}

// usage is one key's share and the gateway-wide admission numbers.
type usage struct {
	live, queued    int
	mem, disk       int64 // the key's, MiB
	vol             int64 // MiB of the key's volumes
	used, allQueued int
	allMem, allDisk int64 // MiB
}

func (s *slots) usage(key string) usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := usage{used: s.used, allQueued: s.queued, allMem: s.mem, allDisk: s.disk}
	if k := s.keys[key]; k != nil {
		u.live, u.queued, u.mem, u.disk, u.vol = k.live, k.waiters.Len(), k.mem, k.disk, k.vol
	}
	return u
}

// committed returns the memory and disk (MiB) committed gateway-wide.
func (s *slots) committed() (mem, disk int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mem, s.disk
}

// gib formats MiB as GiB.
func gib(mib int64) string {
	return fmt.Sprintf("%.4g GiB", float64(mib)/1024)
}
