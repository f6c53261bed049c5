package sandbox

import (
	"context"
	"time"

	"github.com/sandgate/sandgate/internal/store"
)

// The service speaks the store's types: a Record is what it promised a
// client about a sandbox, a Lease one grant of access to it, a Snapshot a
// captured filesystem (see package store).
type (
	Record   = store.Record
	Lease    = store.Lease
	Scope    = store.Scope
	Snapshot = store.Snapshot
	// Store keeps records and leases (Options.Store); a SharedStore is
	// one other replicas write too, read again on every call.
	Store       = store.Store
	SharedStore = store.SharedStore
)

// The scopes a lease may have.
const (
	ScopeOwner   = store.ScopeOwner
	ScopeOperate = store.ScopeOperate
)

// storeTimeout bounds a store write no request waits for (activity, the
// record of a state the provider reported, the removal of a deleted
// sandbox's record), which runs detached from any request's cancellation.
const storeTimeout = 30 * time.Second

// detached is ctx without its cancellation and with storeTimeout: for a
// store write that records what already happened, so that a client going
// away does not leave the store behind memory.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
}

// persist writes b's record, as it is in memory when the write starts, to
// the store. Writes of one record are serialised by b.wmu and each writes
// the latest record, so the store ends with the last change whatever
// order the callers' changes and writes interleave in; once b is removed
// (see remove) nothing is written for it. Caller must not hold s.mu.
func (s *Service) persist(ctx context.Context, b *box) error {
	b.wmu.Lock()
	defer b.wmu.Unlock()
	s.mu.Lock()
	rec, registered := b.rec, s.boxes[b.rec.ID] == b
	s.mu.Unlock()
	if !registered {
		return nil
	}
	return s.st.PutRecord(ctx, rec, nil)
}
