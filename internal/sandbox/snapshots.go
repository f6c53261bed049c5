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
// fork's, are not listed), oldest first.
func (s *Service) Snapshots(ctx context.Context, c Caller) ([]Snapshot, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Snapshot{}
	for _, sn := range s.snaps {
		if sn.Creator == creator && !sn.Internal {
			out = append(out, sn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

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
	if !ok || sn.Creator != creator || sn.Internal {
		return Snapshot{}, providers.Errorf(providers.ErrNotFound, "snapshot %s not found", sid)
	}
	return sn, nil
}

// DeleteSnapshot deletes snapshot sid; refused (ErrConflict) while a
// sandbox made from it exists.
func (s *Service) DeleteSnapshot(ctx context.Context, c Caller, sid string) error {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return err
	}
	if _, err := s.ownSnapshot(creator, sid); err != nil {
		return err
	}
	if users := s.snapshotUsers(sid); len(users) > 0 {
		return providers.Errorf(providers.ErrConflict, "snapshot %s is in use by %d sandbox(es), e.g. %s: delete them first", sid, len(users), users[0])
	}
	return s.dropSnapshot(ctx, sid)
}

// snapshotUsers are the sandboxes made from snapshot sid.
func (s *Service) snapshotUsers(sid string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, b := range s.boxes {
		if b.rec.Snapshot == sid {
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

// releaseSnapshot deletes an internal snapshot (a fork's) once no
// sandbox made from it is left.
func (s *Service) releaseSnapshot(ctx context.Context, sid string) {
	if sid == "" {
		return
	}
	s.mu.Lock()
	sn, ok := s.snaps[sid]
	s.mu.Unlock()
	if !ok || !sn.Internal || len(s.snapshotUsers(sid)) > 0 {
		return
	}
	if err := s.dropSnapshot(ctx, sid); err != nil {
		s.log.Warn("delete a fork's snapshot", "snapshot", sid, "err", err)
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
