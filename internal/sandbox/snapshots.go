package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
)

// MaxFork is the most sandboxes one fork, or one batch create, makes.
const MaxFork = 64

// snapshotter returns the provider's Snapshotter and the store's
// SnapshotStore, or ErrUnsupported.
func (s *Service) snapshotter() (providers.Snapshotter, store.SnapshotStore, error) {
	p, ok := s.p.(providers.Snapshotter)
	if !ok {
		return nil, nil, providers.Errorf(providers.ErrUnsupported, "provider %s cannot snapshot sandboxes", s.p.Name())
	}
	st, ok := s.st.(store.SnapshotStore)
	if !ok {
		return nil, nil, providers.Errorf(providers.ErrUnsupported, "snapshots are not kept by this gateway's state store")
	}
	return p, st, nil
}

// loadSnapshots reads the snapshots at start-up.
func (s *Service) loadSnapshots(ctx context.Context) error {
	st, ok := s.st.(store.SnapshotStore)
	if !ok {
		return nil
	}
	sns, err := st.LoadSnapshots(ctx)
	if err != nil {
		return err
	}
	for _, sn := range sns {
		s.snaps[sn.ID] = sn
	}
	return nil
}

// Snapshot captures sandbox id's filesystem (owner). The sandbox keeps
// running; it must be running.
func (s *Service) Snapshot(ctx context.Context, c Caller, id, name string) (Snapshot, error) {
	if len(name) > 128 {
		return Snapshot{}, providers.InvalidFields{{Field: "name", Message: "at most 128 bytes"}}
	}
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return Snapshot{}, err
	}
	s.mu.Lock()
	key := a.box.rec.Creator
	s.mu.Unlock()
	if err := s.checkSnapshotQuota(key); err != nil {
		return Snapshot{}, err
	}
	sn, err := s.snapshot(ctx, a.box, name, false)
	if err != nil {
		return Snapshot{}, err
	}
	// Its size is known only now; concurrent snapshots of the key may
	// have passed the check above together.
	if err := s.checkSnapshotQuotaAfter(key, sn.SizeBytes); err != nil {
		if derr := s.dropSnapshot(context.WithoutCancel(ctx), sn.ID); derr != nil {
			s.log.Error("delete a snapshot over quota", "snapshot", sn.ID, "err", derr)
		}
		return Snapshot{}, err
	}
	return sn, nil
}

func (s *Service) snapshot(ctx context.Context, b *box, name string, internal bool) (Snapshot, error) {
	p, st, err := s.snapshotter()
	if err != nil {
		return Snapshot{}, err
	}
	end, err := s.begin(b)
	if err != nil {
		return Snapshot{}, err
	}
	defer end()
	s.mu.Lock()
	rec := b.rec
	s.mu.Unlock()
	sn := Snapshot{ID: newSnapshotID(), SandboxID: rec.ID, Name: name, Creator: rec.Creator, Provider: s.p.Name(),
		Image: rec.Image, Workdir: rec.Workdir, Internal: internal}
	if sn.Name == "" {
		sn.Name = "snapshot of " + rec.ID
	}
	start := time.Now()
	size, err := p.Snapshot(ctx, rec.ID, sn.ID)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot %s: %w", rec.ID, err)
	}
	sn.SizeBytes, sn.CreatedAt = size, s.opts.Clock.Now()
	if err := st.PutSnapshot(ctx, sn); err != nil {
		if derr := p.DeleteSnapshot(context.WithoutCancel(ctx), sn.ID); derr != nil {
			s.log.Error("delete an unrecorded snapshot", "snapshot", sn.ID, "err", derr)
		}
		return Snapshot{}, err
	}
	s.mu.Lock()
	s.snaps[sn.ID] = sn
	s.mu.Unlock()
	s.log.Info("snapshot taken", "sandbox", rec.ID, "snapshot", sn.ID, "size", size, "duration", time.Since(start))
	return sn, nil
}

// Snapshots lists the snapshots the caller's key owns (internal ones, a
// fork's, and deleted ones still held for their sandboxes are not
// listed), oldest first.
func (s *Service) Snapshots(ctx context.Context, c Caller) ([]Snapshot, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Snapshot{}
	for _, sn := range s.snaps {
		if sn.Creator == creator && !hidden(sn) {
			out = append(out, sn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// hidden reports whether sn is kept only for the sandboxes made from it:
// a fork's, or one its owner deleted. Its owner no longer sees it.
func hidden(sn Snapshot) bool { return sn.Internal || sn.Deleted }

// GetSnapshot describes snapshot sid; another key's is not found.
func (s *Service) GetSnapshot(ctx context.Context, c Caller, sid string) (Snapshot, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return Snapshot{}, err
	}
	return s.ownSnapshot(creator, sid)
}

func (s *Service) ownSnapshot(creator, sid string) (Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[sid]
	if !ok || sn.Creator != creator || hidden(sn) {
		return Snapshot{}, providers.Errorf(providers.ErrNotFound, "snapshot %s not found", sid)
	}
	return sn, nil
}

// SnapshotDeletion is what DeleteSnapshot did.
type SnapshotDeletion struct {
	// Deleted: this call deleted the snapshot (false: the key had no
	// such snapshot, or it was deleted already).
	Deleted bool
	// Deferred: sandboxes made from the snapshot still exist; its
	// storage is freed when the last of them is removed.
	Deferred bool
}

// DeleteSnapshot deletes snapshot sid of the caller's key. It may be
// repeated: an unknown id, one already deleted and another key's (which
// is left alone) all answer a zero SnapshotDeletion. While sandboxes made
// from the snapshot exist it is deleted for the caller at once (gone from
// list, get, creates and the key's snapshot quota) and its storage is
// freed when the last of them is removed, or at the next start of the
// gateway if it was down then. ErrUnsupported on a provider without
// snapshots.
func (s *Service) DeleteSnapshot(ctx context.Context, c Caller, sid string) (SnapshotDeletion, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return SnapshotDeletion{}, err
	}
	_, st, err := s.snapshotter()
	if err != nil {
		return SnapshotDeletion{}, err
	}
	s.mu.Lock()
	sn, ok := s.snaps[sid]
	visible := ok && sn.Creator == creator && !sn.Internal
	first := visible && !sn.Deleted
	if first {
		sn.Deleted = true
		s.snaps[sid] = sn
	}
	s.mu.Unlock()
	if !visible {
		return SnapshotDeletion{}, nil
	}
	if first {
		// The mark is durable before any storage goes, so that a
		// restart finishes what this call began.
		if err := st.PutSnapshot(ctx, sn); err != nil {
			s.mu.Lock()
			sn.Deleted = false
			s.snaps[sid] = sn
			s.mu.Unlock()
			return SnapshotDeletion{}, err
		}
	}
	done := SnapshotDeletion{Deleted: first, Deferred: true}
	if users := s.snapshotUsers(sid); len(users) > 0 {
		s.log.Info("snapshot deleted; its storage is kept for the sandboxes made from it", "snapshot", sid, "sandboxes", len(users))
		return done, nil
	}
	// A repeated delete retries the storage of a snapshot whose first
	// delete could not free it. A create from it that raced this delete
	// holds it in the provider (ErrConflict): it goes with that sandbox.
	if err := s.dropSnapshot(ctx, sid); err != nil {
		if errors.Is(err, providers.ErrConflict) {
			return done, nil
		}
		return SnapshotDeletion{}, err
	}
	done.Deferred = false
	return done, nil
}

// snapshotUsers are the live sandboxes made from snapshot sid. One that
// ended but is not removed yet may still hold it in the provider, which
// then refuses its delete (ErrConflict) until that sandbox is removed.
func (s *Service) snapshotUsers(sid string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, b := range s.boxes {
		if b.rec.Snapshot == sid && b.rec.State.Live() {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// dropSnapshot deletes snapshot sid from the provider and the store.
func (s *Service) dropSnapshot(ctx context.Context, sid string) error {
	p, st, err := s.snapshotter()
	if err != nil {
		return err
	}
	if err := p.DeleteSnapshot(ctx, sid); err != nil && !errors.Is(err, providers.ErrNotFound) {
		return fmt.Errorf("delete snapshot %s: %w", sid, err)
	}
	if err := st.DeleteSnapshot(ctx, sid); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.snaps, sid)
	s.mu.Unlock()
	s.log.Info("snapshot deleted", "snapshot", sid)
	return nil
}

// releaseSnapshot deletes a hidden snapshot (a fork's, or one its owner
// deleted) once no sandbox made from it is left.
func (s *Service) releaseSnapshot(ctx context.Context, sid string) {
	if sid == "" {
		return
	}
	s.mu.Lock()
	sn, ok := s.snaps[sid]
	s.mu.Unlock()
	if !ok || !hidden(sn) || len(s.snapshotUsers(sid)) > 0 {
		return
	}
	switch err := s.dropSnapshot(ctx, sid); {
	case errors.Is(err, providers.ErrConflict):
		// An ended sandbox made from it is not removed yet; its
		// removal calls this again.
		s.log.Debug("snapshot still held by an ended sandbox", "snapshot", sid, "err", err)
	case err != nil:
		s.log.Warn("delete a snapshot no sandbox uses any more", "snapshot", sid, "err", err)
	}
}

// releaseSnapshots is releaseSnapshot for every hidden snapshot, at
// start-up: the last sandbox made from one may have gone while the
// gateway was down, or its storage may not have been freed then.
func (s *Service) releaseSnapshots(ctx context.Context) {
	s.mu.Lock()
	var sids []string
	for sid, sn := range s.snaps {
		if hidden(sn) {
			sids = append(sids, sid)
		}
	}
	s.mu.Unlock()
	sort.Strings(sids)
	for _, sid := range sids {
		s.releaseSnapshot(ctx, sid)
	}
}

// Fork snapshots sandbox id (owner) and makes count sandboxes from the
// snapshot, all or nothing. Each has an owner lease of its own.
func (s *Service) Fork(ctx context.Context, c Caller, id string, count int) ([]Ref, error) {
	if count < 1 || count > MaxFork {
		return nil, providers.InvalidFields{{Field: "count", Message: fmt.Sprintf("must be 1 to %d", MaxFork)}}
	}
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	key := a.box.rec.Creator
	s.mu.Unlock()
	// All or nothing: forks over the key's quota are refused before any
	// is made (they have the default resources).
	if err := s.slots.check(s.demandOf(key, providers.Resources{}), count); err != nil {
		return nil, err
	}
	sn, err := s.snapshot(ctx, a.box, "fork of "+id, true)
	if err != nil {
		return nil, err
	}
	refs, errs := s.createN(ctx, count, sn.Creator, CreateRequest{SnapshotID: sn.ID, Image: sn.Image, Workdir: sn.Workdir}, &sn)
	if err := errors.Join(errs...); err != nil {
		for i, r := range refs {
			if errs[i] == nil {
				s.removeID(context.WithoutCancel(ctx), r.SandboxID, "fork failed")
			}
		}
		s.releaseSnapshot(context.WithoutCancel(ctx), sn.ID)
		return nil, firstError(errs)
	}
	return refs, nil
}

func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// removeID removes sandbox id if it is still registered.
func (s *Service) removeID(ctx context.Context, id, why string) {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b != nil {
		if err := s.remove(ctx, b, why); err != nil {
			s.log.Warn("remove sandbox", "sandbox", id, "err", err)
		}
	}
}
