package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// validate checks what the schema cannot (paths, names, duplicates) and
// the ceilings c, and fills in the default workdir. It returns every
// problem at once, as providers.InvalidFields.
func (r *CreateRequest) validate(c Ceilings, capAllow []string) error {
	var bad providers.InvalidFields
	if r.Workdir == "" {
		r.Workdir = defaultWorkdir
	} else if !path.IsAbs(r.Workdir) {
		bad.Add("workdir", "must be an absolute path")
	} else if err := checkPath(r.Workdir); err != nil {
		bad.Add("workdir", "%s", err)
	} else {
		r.Workdir = path.Clean(r.Workdir)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
	}{{"ttl_s", r.TTL}, {"idle_timeout_s", r.IdleTimeout}, {"ready_timeout_s", r.ReadyTimeout}} {
		if d.v != nil && *d.v < 0 {
			bad.Add(d.name, "must not be negative")
		}
	}
	seen := map[int]bool{}
	for i, p := range r.Ports {
		if p < 1 || p > 65535 {
			bad.Add(fmt.Sprintf("ports[%d]", i), "port %d is outside 1..65535", p)
		} else if seen[p] {
			bad.Add(fmt.Sprintf("ports[%d]", i), "port %d is listed twice", p)
		}
		seen[p] = true
	}
	for k := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			bad.Add("env", "invalid variable name %q", k)
		}
	}
	for _, p := range sortedKeys(r.Files) {
		if err := checkPath(p); err != nil {
			bad.Add("files", "%q: %s", p, err)
		}
	}
	r.shmBytes = 0
	if r.ShmSize != nil {
		n, err := parseShmSize(r.ShmSize)
		if err == nil {
			err = checkShmSize(n, r.Resources.MemoryMiB)
		}
		if err != nil {
			bad.Add("shm_size", "%s", err)
		}
		r.shmBytes = n
	}
	r.validateNet(capAllow, &bad)
	c.checkCreate(r, &bad)
	return bad.Err()
}

// without returns a copy of m without key.
func without(m map[string]any, key string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// Create makes a sandbox, waiting in the capacity queue if the gateway is
// full, and returns an owner lease for it. It returns only once the
// sandbox is ready and its files are written; on failure nothing is left.
func (s *Service) Create(ctx context.Context, c Caller, req CreateRequest) (Ref, error) {
	creator, req, sn, err := s.prepare(c, req)
	if err != nil {
		return Ref{}, err
	}
	return s.createFor(ctx, creator, req, sn)
}

// BatchFailure is one create of a batch that failed.
type BatchFailure struct {
	Index int
	Err   error
}

// CreateBatch makes count sandboxes of req at once. All or nothing unless
// allowPartial: then it returns the ones made and the failures, and an
// error only when none was made.
func (s *Service) CreateBatch(ctx context.Context, c Caller, req CreateRequest, count int, allowPartial bool) ([]Ref, []BatchFailure, error) {
	if count < 1 || count > MaxFork {
		return nil, nil, providers.InvalidFields{{Field: "count", Message: fmt.Sprintf("must be 1 to %d", MaxFork)}}
	}
	creator, req, sn, err := s.prepare(c, req)
	if err != nil {
		return nil, nil, err
	}
	if !allowPartial {
		// All or nothing: a batch over the key's quota is refused before
		// any of it is made.
		if err := s.slots.check(s.demandOf(creator, req.Resources), count); err != nil {
			return nil, nil, err
		}
	}
	refs, errs := s.createN(ctx, count, creator, req, sn)
	var made []Ref
	var failed []BatchFailure
	for i, err := range errs {
		if err != nil {
			failed = append(failed, BatchFailure{Index: i, Err: err})
		} else {
			made = append(made, refs[i])
		}
	}
	if len(failed) == 0 || (allowPartial && len(made) > 0) {
		return made, failed, nil
	}
	for _, r := range made {
		s.removeID(context.WithoutCancel(ctx), r.SandboxID, "batch failed")
	}
	return nil, nil, failed[0].Err
}

// createN runs n createFor at once (at most createsAtOnce in flight) and
// returns each one's ref or error, by index.
func (s *Service) createN(ctx context.Context, n int, creator string, req CreateRequest, sn *Snapshot) ([]Ref, []error) {
	refs, errs := make([]Ref, n), make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, createsAtOnce)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			refs[i], errs[i] = s.createFor(ctx, creator, req, sn)
		}()
	}
	wg.Wait()
	return refs, errs
}

// createsAtOnce bounds the provider creates one batch or fork runs at once.
const createsAtOnce = 8

// prepare authorises a create and resolves its snapshot (given at the top
// level or as NeMo Gym's provider_options.snapshot_id): the creator, the
// request with the snapshot's image and workdir as defaults, and the
// snapshot (nil for none).
func (s *Service) prepare(c Caller, req CreateRequest) (string, CreateRequest, *Snapshot, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return "", req, nil, err
	}
	// NeMo Gym names the snapshot and the size of /dev/shm in
	// provider_options.
	if v, ok := req.ProviderOptions["snapshot_id"]; ok {
		sid, isString := v.(string)
		if !isString || (req.SnapshotID != "" && req.SnapshotID != sid) {
			return "", req, nil, providers.InvalidFields{{Field: "provider_options.snapshot_id", Message: "must be a string, and the same as snapshot_id if both are given"}}
		}
		req.SnapshotID = sid
		req.ProviderOptions = without(req.ProviderOptions, "snapshot_id")
	}
	if v, ok := req.ProviderOptions["shm_size"]; ok {
		if req.ShmSize != nil {
			return "", req, nil, providers.InvalidFields{{Field: "provider_options.shm_size", Message: "give shm_size once: at the top level or here"}}
		}
		req.ShmSize = v
		req.ProviderOptions = without(req.ProviderOptions, "shm_size")
	}
	if v, ok := req.ProviderOptions["cap_add"]; ok {
		caps, isList := stringList(v)
		if !isList || len(req.CapAdd) > 0 {
			return "", req, nil, providers.InvalidFields{{Field: "provider_options.cap_add", Message: "must be a list of capability names, given once: at the top level or here"}}
		}
		req.CapAdd = caps
		req.ProviderOptions = without(req.ProviderOptions, "cap_add")
	}
	if err := s.prepareVolumes(creator, &req); err != nil {
		return "", req, nil, err
	}
	var sn *Snapshot
	if req.SnapshotID != "" {
		if _, _, err := s.snapshotter(); err != nil {
			return "", req, nil, err
		}
		got, err := s.ownSnapshot(creator, req.SnapshotID)
		if err != nil {
			return "", req, nil, err
		}
		if req.Image == "" {
			req.Image = got.Image
		}
		if req.Workdir == "" {
			req.Workdir = got.Workdir
		}
		sn = &got
	}
	return creator, req, sn, nil
}

// createFor is Create for creator, from snapshot sn when not nil.
func (s *Service) createFor(ctx context.Context, creator string, req CreateRequest, sn *Snapshot) (Ref, error) {
	if sn != nil {
		req.SnapshotID = sn.ID
	}
	if err := req.validate(s.opts.Ceilings, s.opts.CapAddAllow); err != nil {
		return Ref{}, err
	}
	if err := s.checkEgress(req.Egress); err != nil {
		return Ref{}, err
	}
	if _, ok := s.p.(providers.Pauser); req.PauseOnExpiry && !ok {
		return Ref{}, providers.Errorf(providers.ErrUnsupported, "pausing at expiry is not supported by provider %s: it cannot pause a sandbox", s.p.Name())
	}
	if _, ok := s.p.(providers.Grouper); req.Group != "" && !ok {
		return Ref{}, providers.Errorf(providers.ErrUnsupported, "sandbox groups are not supported by provider %s", s.p.Name())
	}
	d := s.demandOf(creator, req.Resources)
	if err := s.slots.acquire(ctx, d, s.opts.QueueTimeout); err != nil {
		outcome := "unavailable"
		if providers.Kind(err) == providers.ErrTooMany || providers.Kind(err) == providers.ErrInvalid {
			outcome = "refused"
		}
		s.m.CreatesTotal.WithLabelValues(s.p.Name(), outcome).Inc()
		return Ref{}, err
	}
	release, err := s.holdVolumes(req.volumeIDs)
	if err != nil {
		s.slots.release(d)
		return Ref{}, err
	}
	defer release() // once made, its record holds the volumes
	start := time.Now()
	ref, err := s.create(ctx, creator, req, d)
	if err != nil {
		s.slots.release(d)
		s.m.CreatesTotal.WithLabelValues(s.p.Name(), "error").Inc()
		return Ref{}, err
	}
	s.m.CreatesTotal.WithLabelValues(s.p.Name(), "ok").Inc()
	s.m.CreateSeconds.Observe(time.Since(start).Seconds())
	return ref, nil
}

// countStates counts the sandboxes by state (for the metrics).
func (s *Service) countStates() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := map[string]int{}
	for _, b := range s.boxes {
		n[string(b.rec.State)]++
	}
	return n
}

// create makes the sandbox of req for creator, which holds slot (acquired
// by the caller, released by it on failure).
func (s *Service) create(ctx context.Context, creator string, req CreateRequest, slot demand) (Ref, error) {
	ttl := s.opts.DefaultTTL
	if req.TTL != nil {
		ttl = *req.TTL
	}
	ready := s.opts.DefaultReadyTimeout
	if req.ReadyTimeout != nil && *req.ReadyTimeout > 0 {
		ready = *req.ReadyTimeout
	}
	id := newSandboxID()
	start := s.opts.Clock.Now()
	hostname := cmpOr(req.Hostname, DefaultHostname)
	var gid string
	if req.Group != "" {
		gid = groupID(creator, req.Group)
		release, err := s.reserveNames(gid, id, groupNames(hostname, req.Aliases))
		if err != nil {
			return Ref{}, err
		}
		defer release() // once registered, its record holds the names
	}
	sb, claimed := s.claim(req)
	if claimed {
		id = sb.ID
		extra := make(map[string]any, len(sb.Extra)+1)
		for k, v := range sb.Extra {
			extra[k] = v
		}
		extra["warm_pool"] = true
		sb.Extra = extra
	}
	if s.shared != nil {
		// Other replicas reconcile too: the record comes first, so that a
		// sandbox of theirs without one is an orphan, never this create.
		prov := Record{ID: id, Provider: s.p.Name(), State: providers.StateStarting, Workdir: req.Workdir, Image: req.Image, CreatedAt: start, Creator: creator}
		if err := s.st.PutRecord(ctx, prov, nil); err != nil {
			return Ref{}, providers.Wrap(providers.ErrUnavailable, err, "the shared state store")
		}
	}
	var err error
	if !claimed {
		sb, err = s.p.Create(ctx, providers.CreateSpec{
			ID:           id,
			Image:        req.Image,
			Workdir:      req.Workdir,
			Env:          req.Env,
			Resources:    req.Resources,
			Entrypoint:   req.Entrypoint,
			Ports:        req.Ports,
			Options:      req.ProviderOptions,
			ReadyTimeout: ready,
			Snapshot:     req.SnapshotID,
			ShmBytes:     req.shmBytes,
			Volumes:      req.mounts,
			Hostname:     hostname,
			CapAdd:       req.CapAdd,
			Egress:       req.Egress,
			Group:        gid,
		})
	}
	if err != nil {
		if s.shared != nil {
			if derr := s.forgetCreate(ctx, id); derr != nil {
				s.log.Error("forget a failed create", "sandbox", id, "err", derr)
			}
		}
		return Ref{}, fmt.Errorf("create sandbox: %w", err)
	}
	if pol := req.Egress; pol != nil && !pol.None() {
		if err = s.p.(providers.Egresser).SetEgress(ctx, id, *pol); err != nil {
			err = fmt.Errorf("egress policy: %w", err)
		}
	}
	var addr string
	if gid != "" && err == nil {
		addr, err = s.joinGroup(ctx, id, gid)
	}
	for _, p := range sortedKeys(req.Files) {
		if err != nil {
			break
		}
		if _, err = s.p.WriteFile(ctx, id, resolve(sb.Workdir, p), strings.NewReader(req.Files[p])); err != nil {
			err = fmt.Errorf("write file %q: %w", p, err)
		}
	}
	now := s.opts.Clock.Now()
	rec := Record{
		ID:        id,
		Provider:  s.p.Name(),
		State:     providers.StateRunning,
		Workdir:   sb.Workdir,
		Image:     req.Image,
		CreatedAt: start,
		TTL:       ttl,
		Metadata:  req.Metadata,
		Ports:     req.Ports,
		Extra:     sb.Extra,
		Creator:   creator,
		Snapshot:  req.SnapshotID,
		Resources: req.Resources,
		Volumes:   req.volumeIDs,
		Egress:    req.Egress,
		Group:     req.Group,
		GroupID:   gid,
		Hostname:  hostname,
		Aliases:   req.Aliases,
		Address:   addr,
		CapAdd:    req.CapAdd,
	}
	rec.PauseOnExpiry = req.PauseOnExpiry
	if claimed {
		rec.Env = req.Env // a pool's sandbox started without it: every command gets it
	}
	if ttl > 0 {
		rec.ExpiresAt = now.Add(ttl)
	}
	if req.IdleTimeout != nil {
		rec.IdleTimeout = *req.IdleTimeout
	}
	lease := Lease{ID: newLeaseID(), SandboxID: id, Scope: ScopeOwner, CreatedAt: now}
	if err == nil && gid != "" {
		// The members' names in its /etc/hosts before create returns.
		err = s.writeHosts(ctx, &rec, gid, false)
	}
	if err == nil {
		err = s.st.PutRecord(ctx, rec, &lease)
	}
	if err != nil {
		// Detached: the client's context may be what failed.
		if derr := s.p.Delete(context.WithoutCancel(ctx), id); derr != nil {
			s.log.Error("delete half-made sandbox", "sandbox", id, "err", derr)
		}
		if s.shared != nil {
			if derr := s.forgetCreate(ctx, id); derr != nil {
				s.log.Error("forget a failed create", "sandbox", id, "err", derr)
			}
		}
		return Ref{}, err
	}
	s.mu.Lock()
	s.boxes[id] = &box{rec: rec, lastActivity: now, slot: &slot}
	s.leases[lease.ID] = lease
	s.mu.Unlock()
	if gid != "" {
		// Its names in the other members' /etc/hosts.
		_ = s.writeHosts(ctx, nil, gid, true)
	}
	s.log.Info("sandbox created", "sandbox", id, "provider", s.p.Name(), "duration", now.Sub(start))
	return s.ref(rec, lease), nil
}

// forgetCreate removes the record a create wrote before its sandbox
// existed (see create), detached: the client's context may be what failed.
func (s *Service) forgetCreate(ctx context.Context, id string) error {
	ctx, cancel := detached(ctx)
	defer cancel()
	return s.st.DeleteSandbox(ctx, id)
}

func (s *Service) ref(rec Record, l Lease) Ref {
	return Ref{
		SandboxID: rec.ID,
		Token:     s.sign.mint(claims{SandboxID: rec.ID, LeaseID: l.ID, Scope: l.Scope, Expires: l.ExpiresAt}),
		LeaseID:   l.ID,
		Scope:     l.Scope,
		Provider:  rec.Provider,
		Workdir:   rec.Workdir,
		ExpiresAt: l.ExpiresAt,
		Extra:     rec.Extra,
	}
}

// List returns the sandboxes the caller's API key created (all of them for
// an anonymous caller on a gateway without keys), oldest first.
func (s *Service) List(ctx context.Context, c Caller, f ListFilter) ([]Info, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return nil, err
	}
	var lk, lv string
	if f.Label != "" {
		var ok bool
		if lk, lv, ok = strings.Cut(f.Label, "="); !ok || lk == "" {
			return nil, providers.InvalidFields{{Field: "label", Message: "must be key=value"}}
		}
	}
	if err := s.syncShared(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Info{}
	for _, b := range s.boxes {
		if b.rec.Creator != creator || (f.Status != "" && b.rec.State != f.Status) {
			continue
		}
		if lk != "" {
			if v, ok := b.rec.Metadata[lk]; !ok || v != lv {
				continue
			}
		}
		out = append(out, b.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Get returns a sandbox's info, with its state refreshed from the provider.
func (s *Service) Get(ctx context.Context, c Caller, id string) (Info, error) {
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return Info{}, err
	}
	s.refresh(ctx, a.box)
	s.mu.Lock()
	info := a.box.info()
	s.mu.Unlock()
	if ec, ok := s.p.(providers.EgressCounter); ok && info.Egress != nil && !info.Egress.None() {
		st := ec.EgressStats(id)
		info.EgressStats = &st
	}
	return info, nil
}

// refresh asks the provider for a live sandbox's state and records a
// sandbox that ended on its own as stopped.
func (s *Service) refresh(ctx context.Context, b *box) {
	s.mu.Lock()
	id, state := b.rec.ID, b.rec.State
	s.mu.Unlock()
	if !state.Live() || state == providers.StateStarting {
		return
	}
	got, err := s.p.Status(ctx, id)
	switch {
	case errors.Is(err, providers.ErrNotFound):
		got = providers.StateStopped
	case err != nil:
		s.log.Warn("sandbox status", "sandbox", id, "err", err)
		return
	}
	if got == state || got == providers.StateUnknown {
		return
	}
	if r, ok := s.p.(providers.StateReasoner); ok && got == providers.StateError {
		s.mu.Lock()
		b.rec.StateReason = r.StateReason(id)
		s.mu.Unlock()
	}
	s.setState(ctx, b, got)
}

// setState records a new state for b and frees its slot when it stops.
// The store write is detached from ctx's cancellation: the state is what
// the provider did, whether or not the client still waits.
func (s *Service) setState(ctx context.Context, b *box, state providers.State) {
	s.mu.Lock()
	b.rec.State = state
	id := b.rec.ID
	var slot *demand
	if !state.Live() {
		slot, b.slot = b.slot, nil
	}
	s.mu.Unlock()
	if slot != nil {
		s.slots.release(*slot)
	}
	ctx, cancel := detached(ctx)
	defer cancel()
	if err := s.persist(ctx, b); err != nil {
		s.log.Error("persist sandbox state", "sandbox", id, "err", err)
	}
}

// Renew sets the sandbox's expiry to now + ttl (nil: its current TTL;
// 0: no expiry). A ttl over the TTL ceiling (0 included, when there is
// one) is ErrInvalid.
func (s *Service) Renew(ctx context.Context, c Caller, id string, ttl *time.Duration) (Info, error) {
	if ttl != nil {
		var bad providers.InvalidFields
		if *ttl < 0 {
			bad.Add("ttl_s", "must not be negative")
		}
		s.opts.Ceilings.checkTTL("ttl_s", *ttl, &bad)
		if err := bad.Err(); err != nil {
			return Info{}, err
		}
	}
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	b := a.box
	if !b.rec.State.Live() {
		s.mu.Unlock()
		return Info{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, b.rec.State)
	}
	if ttl != nil {
		b.rec.TTL = *ttl
	}
	b.rec.ExpiresAt = time.Time{}
	if b.rec.TTL > 0 {
		b.rec.ExpiresAt = s.opts.Clock.Now().Add(b.rec.TTL)
	}
	info := b.info()
	s.mu.Unlock()
	return info, s.persist(ctx, b)
}

// Pause freezes a running sandbox.
func (s *Service) Pause(ctx context.Context, c Caller, id string) (Info, error) {
	return s.pauseResume(ctx, c, id, true)
}

// Resume thaws a paused sandbox.
func (s *Service) Resume(ctx context.Context, c Caller, id string) (Info, error) {
	return s.pauseResume(ctx, c, id, false)
}

func (s *Service) pauseResume(ctx context.Context, c Caller, id string, pause bool) (Info, error) {
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return Info{}, err
	}
	p, ok := s.p.(providers.Pauser)
	if !ok {
		// kubernetes: the Pod API has no freeze, and the sandbox's
		// processes are not the gateway's to stop one by one.
		return Info{}, providers.Errorf(providers.ErrUnsupported, "pause and resume are not supported by provider %s: it cannot freeze a sandbox's processes in place; the sandbox keeps running", s.p.Name())
	}
	from, to, do := providers.StateRunning, providers.StatePaused, p.Pause
	if !pause {
		from, to, do = providers.StatePaused, providers.StateRunning, p.Resume
	}
	s.mu.Lock()
	state := a.box.rec.State
	s.mu.Unlock()
	if state != from {
		return Info{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s, not %s", id, state, from)
	}
	if err := do(ctx, id); err != nil {
		return Info{}, fmt.Errorf("%s %s: %w", map[bool]string{true: "pause", false: "resume"}[pause], id, err)
	}
	if !pause {
		// A sandbox paused at its expiry has none: resuming starts a new
		// TTL.
		s.mu.Lock()
		if r := &a.box.rec; r.ExpiresAt.IsZero() && r.TTL > 0 {
			r.ExpiresAt = s.opts.Clock.Now().Add(r.TTL)
		}
		s.mu.Unlock()
	}
	s.setState(ctx, a.box, to)
	s.touch(a.box)
	s.mu.Lock()
	defer s.mu.Unlock()
	return a.box.info(), nil
}

// Endpoint returns how to reach a port declared at create.
func (s *Service) Endpoint(ctx context.Context, c Caller, id string, port int) (providers.Endpoint, error) {
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return providers.Endpoint{}, err
	}
	e, ok := s.p.(providers.Endpointer)
	if !ok {
		return providers.Endpoint{}, providers.Errorf(providers.ErrUnsupported, "endpoints are not supported by provider %s", s.p.Name())
	}
	s.mu.Lock()
	declared := false
	for _, p := range a.box.rec.Ports {
		declared = declared || p == port
	}
	s.mu.Unlock()
	if !declared {
		return providers.Endpoint{}, providers.Errorf(providers.ErrNotFound, "port %d was not declared at create", port)
	}
	return e.Endpoint(ctx, id, port)
}

// Delete stops the sandbox and forgets it and every lease for it. Only an
// owner may delete; a second delete answers ErrNotFound.
func (s *Service) Delete(ctx context.Context, c Caller, id string) error {
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return err
	}
	return s.remove(ctx, a.box, "deleted")
}

// remove deletes the sandbox from the provider, then from the registry.
// When the provider fails the sandbox stays so the delete can be retried.
func (s *Service) remove(ctx context.Context, b *box, why string) error {
	s.mu.Lock()
	id, snap, gid := b.rec.ID, b.rec.Snapshot, b.rec.GroupID
	b.removing = true
	s.mu.Unlock()
	if err := s.p.Delete(ctx, id); err != nil && !errors.Is(err, providers.ErrNotFound) {
		s.mu.Lock()
		b.removing = false
		s.mu.Unlock()
		return fmt.Errorf("delete %s: %w", id, err)
	}
	// Under wmu, so that no write of the record in flight lands after
	// its removal and brings it back (persist writes nothing once b is
	// unregistered).
	b.wmu.Lock()
	if !s.unregister(b) {
		b.wmu.Unlock()
		return errSandboxNotFound(id) // a concurrent delete won
	}
	dctx, cancel := detached(ctx) // the sandbox is gone: its record must go too
	err := s.st.DeleteSandbox(dctx, id)
	cancel()
	b.wmu.Unlock()
	defer s.releaseSnapshot(context.WithoutCancel(ctx), snap)
	if gid != "" {
		// The others' /etc/hosts no longer name it.
		hctx, cancel := detached(ctx)
		_ = s.writeHosts(hctx, nil, gid, true)
		cancel()
	}
	s.m.DeletesTotal.WithLabelValues(why).Inc()
	if err != nil {
		s.log.Error("forget sandbox", "sandbox", id, "err", err)
	}
	s.log.Info("sandbox removed", "sandbox", id, "why", why)
	return nil
}
