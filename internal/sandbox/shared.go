package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// With a SharedStore the store, not this replica's memory, is the truth:
// before a call on a sandbox is authorised its record and leases are read
// again (one read of the store per call), a list and the reaper read them
// all, and activity is written back, at most every activityEvery per
// sandbox, so that idle timeouts count every replica's traffic.

// provisionalLife is how long a record of a create in flight (state
// starting, written before the sandbox is made) is left alone by a
// reconciling replica.
const provisionalLife = 10 * time.Minute

// activityEvery is how often a sandbox's activity is written to a
// SharedStore, at most.
const activityEvery = 5 * time.Second

// syncEvery is how often the reaper reads every record of a SharedStore
// (sandboxes made by other replicas expire here too).
const syncEvery = 10 * time.Second

// refreshShared reads sandbox id from the shared store into memory: its
// record and exactly the leases the store holds; a sandbox the store no
// longer has is forgotten here too. A no-op without a shared store.
func (s *Service) refreshShared(ctx context.Context, id string) error {
	if s.shared == nil {
		return nil
	}
	rec, leases, err := s.shared.Sandbox(ctx, id)
	if errors.Is(err, providers.ErrNotFound) {
		s.forget(id)
		return nil
	}
	if err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "the shared state store")
	}
	s.mu.Lock()
	s.adoptLocked(rec, leases)
	s.mu.Unlock()
	return nil
}

// adoptLocked puts rec and its leases (all of them) in memory, keeping
// what this replica knows of the sandbox's activity. Caller holds mu.
func (s *Service) adoptLocked(rec Record, leases []Lease) {
	if b := s.boxes[rec.ID]; b == nil {
		s.boxes[rec.ID] = &box{rec: rec, lastActivity: s.opts.Clock.Now()}
	} else {
		// Only what changes after a create: the rest is read without mu.
		b.rec.State, b.rec.StateReason = rec.State, rec.StateReason
		b.rec.ExpiresAt, b.rec.TTL = rec.ExpiresAt, rec.TTL
		if rec.ActiveAt.After(b.rec.ActiveAt) {
			b.rec.ActiveAt = rec.ActiveAt
		}
	}
	for lid, l := range s.leases {
		if l.SandboxID == rec.ID {
			delete(s.leases, lid)
		}
	}
	for _, l := range leases {
		s.leases[l.ID] = l
	}
}

// forget drops sandbox id from memory (another replica removed it),
// unless a remove of this replica is in flight: the store can lose the
// record before that remove ends (a kubernetes record is owned by its
// pod and collected with it), and the remove, not a sync that saw the
// record gone, must unregister the box and answer its caller.
func (s *Service) forget(id string) {
	s.mu.Lock()
	b := s.boxes[id]
	removing := b != nil && b.removing
	s.mu.Unlock()
	if b != nil && !removing {
		s.unregister(b)
	}
}

// unregister drops b, with its leases, from memory, frees its slot and
// tells the OnRemove hooks. It reports false when b was no longer
// registered (a concurrent removal won).
func (s *Service) unregister(b *box) bool {
	s.mu.Lock()
	id := b.rec.ID
	if s.boxes[id] != b {
		s.mu.Unlock()
		return false
	}
	delete(s.boxes, id)
	for lid, l := range s.leases {
		if l.SandboxID == id {
			delete(s.leases, lid)
		}
	}
	slot := b.slot
	b.slot = nil
	b.rec.State = providers.StateStopped
	hooks := s.onRemove
	s.mu.Unlock()
	if slot != nil {
		s.slots.release(*slot)
	}
	for _, f := range hooks {
		f(id)
	}
	return true
}

// syncShared reads every record and lease of the shared store into
// memory and forgets the sandboxes it no longer has. A no-op without a
// shared store.
func (s *Service) syncShared(ctx context.Context) error {
	if s.shared == nil {
		return nil
	}
	recs, leases, err := s.shared.Load(ctx)
	if err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "the shared state store")
	}
	byBox := map[string][]Lease{}
	for _, l := range leases {
		byBox[l.SandboxID] = append(byBox[l.SandboxID], l)
	}
	have := map[string]bool{}
	s.mu.Lock()
	for _, r := range recs {
		if r.State == providers.StateStarting {
			continue // a create in flight
		}
		have[r.ID] = true
		s.adoptLocked(r, byBox[r.ID])
	}
	var gone []string
	for id := range s.boxes {
		if !have[id] {
			gone = append(gone, id)
		}
	}
	s.mu.Unlock()
	for _, id := range gone {
		s.forget(id)
	}
	return nil
}

// shareActivity writes b's activity at now to the shared store when the
// last write is older than activityEvery. A no-op without a shared store.
// The write has its own deadline: it records activity that happened, for
// every replica, whether or not the request that made it is still there.
func (s *Service) shareActivity(b *box, now time.Time) {
	if s.shared == nil {
		return
	}
	s.mu.Lock()
	if now.Sub(b.rec.ActiveAt) < activityEvery {
		s.mu.Unlock()
		return
	}
	b.rec.ActiveAt = now
	id := b.rec.ID
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := s.shared.Touch(ctx, id, now); err != nil && !errors.Is(err, providers.ErrNotFound) {
		s.log.Warn("record activity in the shared store", "sandbox", id, "err", err)
	}
}

// lastActive is b's last activity on any replica. Caller holds mu.
func (b *box) lastActive() time.Time {
	if b.rec.ActiveAt.After(b.lastActivity) {
		return b.rec.ActiveAt
	}
	return b.lastActivity
}
