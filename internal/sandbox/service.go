// Package sandbox is the service behind the API: the registry of sandboxes,
// leases and their tokens, TTL and idle reaping, the capacity queue,
// persistence, and dispatch to one provider. Every method that acts on a
// sandbox takes the caller's credentials and checks them first, in the order
// 401 -> 403 -> 404, so that sandbox ids cannot be probed.
package sandbox

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
)

// Clock tells the time; tests inject a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Options configure a Service. Zero values take the defaults named.
type Options struct {
	Provider       providers.Provider // required
	StateDir       string             // required: holds sandgate.db and lease.key
	LeaseSecret    string             // "" = persisted random secret in StateDir
	APIKeys        []string           // keys allowed to create and list
	AllowAnonymous bool               // no key needed to create/list (loopback only; decided by the caller)

	MaxSandboxes        int           // default 64
	QueueTimeout        time.Duration // default 600s: how long a create waits for capacity
	DefaultTTL          time.Duration // default 1800s; negative = no expiry
	DefaultReadyTimeout time.Duration // default 60s
	DefaultExecTimeout  time.Duration // default 180s
	MaxExecOutput       int           // default 16 MiB per stream
	MaxExecOutputTotal  int64         // default 256 MiB: output held at once by all execs until released (see Exec)
	MaxExecs            int           // concurrent execs in all sandboxes; default 1024
	MaxExecsPerSandbox  int           // concurrent execs in one sandbox; default 256
	ReapInterval        time.Duration // default 1s

	Clock   Clock // default: the wall clock
	Logger  *slog.Logger
	Metrics *metrics.Metrics // default: metrics.Discard()
}

func (o *Options) defaults() {
	if o.MaxSandboxes <= 0 {
		o.MaxSandboxes = 64
	}
	if o.QueueTimeout <= 0 {
		o.QueueTimeout = 600 * time.Second
	}
	if o.DefaultTTL == 0 {
		o.DefaultTTL = 1800 * time.Second
	} else if o.DefaultTTL < 0 {
		o.DefaultTTL = 0
	}
	if o.DefaultReadyTimeout <= 0 {
		o.DefaultReadyTimeout = 60 * time.Second
	}
	if o.DefaultExecTimeout <= 0 {
		o.DefaultExecTimeout = 180 * time.Second
	}
	if o.MaxExecOutput <= 0 {
		o.MaxExecOutput = 16 << 20
	}
	if o.MaxExecOutputTotal <= 0 {
		o.MaxExecOutputTotal = 256 << 20
	}
	if o.MaxExecs <= 0 {
		o.MaxExecs = 1024
	}
	if o.MaxExecsPerSandbox <= 0 {
		o.MaxExecsPerSandbox = 256
	}
	if o.ReapInterval <= 0 {
		o.ReapInterval = time.Second
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Metrics == nil {
		o.Metrics = metrics.Discard()
	}
}

// Service is the sandbox service. It is safe for concurrent use; Close
// stops its reaper and closes the store (sandboxes keep running).
type Service struct {
	opts  Options
	p     providers.Provider
	st    *store
	sign  signer
	keys  map[string]bool // fingerprints of the API keys
	slots *slots
	log   *slog.Logger
	m     *metrics.Metrics

	mu     sync.Mutex      // guards boxes and leases, and every box's fields
	boxes  map[string]*box // live and stopped sandboxes with a record
	leases map[string]Lease
	execs  int // execs in flight in all sandboxes (MaxExecs)

	out *outputBudget // MaxExecOutputTotal

	onRemove []func(id string) // see OnRemove

	stop     chan struct{}
	reaperWG sync.WaitGroup
}

// box is the in-memory half of a sandbox's state. Fields are guarded by
// Service.mu.
type box struct {
	rec          Record
	lastActivity time.Time
	busy         int  // requests in flight (exec, files): never idle while > 0
	execs        int  // execs in flight (MaxExecsPerSandbox)
	holds        int  // attached clients (PTY): never idle while > 0
	hasSlot      bool // counts against MaxSandboxes
}

// Caller is a request's credentials, as the transport found them.
type Caller struct {
	Lease  string // from X-NeMo-Gym-Sandbox-Lease, X-Sandbox-Lease, ?lease= or the WS subprotocol
	Bearer string // from Authorization: Bearer: an API key or a lease token
}

// New opens the store in opts.StateDir, reconciles it with the provider
// (adopting live sandboxes, marking vanished ones stopped, deleting
// labelled orphans) and starts the reaper.
func New(ctx context.Context, opts Options) (*Service, error) {
	opts.defaults()
	if opts.Provider == nil || opts.StateDir == "" {
		return nil, errors.New("sandbox service needs a provider and a state dir")
	}
	secret, err := loadSecret(opts.LeaseSecret, opts.StateDir)
	if err != nil {
		return nil, err
	}
	st, err := openStore(opts.StateDir)
	if err != nil {
		return nil, err
	}
	s := &Service{
		opts:   opts,
		p:      opts.Provider,
		st:     st,
		sign:   signer{secret: secret},
		keys:   map[string]bool{},
		slots:  newSlots(opts.MaxSandboxes),
		log:    opts.Logger,
		m:      opts.Metrics,
		boxes:  map[string]*box{},
		leases: map[string]Lease{},
		out:    &outputBudget{total: opts.MaxExecOutputTotal},
		stop:   make(chan struct{}),
	}
	for _, k := range opts.APIKeys {
		if k != "" {
			s.keys[keyFingerprint(k)] = true
		}
	}
	if err := s.reconcile(ctx); err != nil {
		st.close()
		return nil, err
	}
	s.m.WatchSandboxes(s.countStates, s.slots.waiting)
	s.reaperWG.Add(1)
	go s.reaper()
	return s, nil
}

// Close stops the reaper and closes the store. Sandboxes keep running and
// are adopted by the next Service on the same state dir.
func (s *Service) Close() error {
	close(s.stop)
	s.reaperWG.Wait()
	return s.st.close()
}

// ProviderName is the name of the provider the service dispatches to.
func (s *Service) ProviderName() string { return s.p.Name() }

// Ready reports whether the store is open and the provider answers.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.st.ping(); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "the state store is not open")
	}
	if err := s.p.Ping(ctx); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "provider "+s.p.Name()+" is not answering")
	}
	return nil
}

func (s *Service) reconcile(ctx context.Context) error {
	recs, leases, err := s.st.load()
	if err != nil {
		return err
	}
	owned, err := s.p.List(ctx)
	if err != nil {
		return fmt.Errorf("list sandboxes of provider %s: %w", s.p.Name(), err)
	}
	have := make(map[string]providers.State, len(owned))
	for _, o := range owned {
		have[o.ID] = o.State
	}
	now := s.opts.Clock.Now()
	for _, r := range recs {
		state, ok := have[r.ID]
		delete(have, r.ID)
		b := &box{rec: r, lastActivity: now}
		switch {
		case ok && state.Live():
			b.rec.State = state
			b.hasSlot = true
			s.slots.take()
		case r.State.Live():
			s.log.Info("sandbox vanished while the gateway was down", "sandbox", r.ID)
			b.rec.State = providers.StateStopped
		}
		if b.rec.State != r.State {
			if err := s.st.putRecord(b.rec, nil); err != nil {
				return err
			}
		}
		s.boxes[r.ID] = b
	}
	for _, l := range leases {
		if _, ok := s.boxes[l.SandboxID]; ok {
			s.leases[l.ID] = l
		}
	}
	for id := range have {
		s.log.Info("deleting orphan sandbox with no record", "sandbox", id)
		if err := s.p.Delete(ctx, id); err != nil && !errors.Is(err, providers.ErrNotFound) {
			s.log.Warn("delete orphan", "sandbox", id, "err", err)
		}
	}
	return nil
}

// access is what an authorised caller may do with one sandbox.
type access struct {
	box     *box
	scope   Scope
	leaseID string    // "" when the caller used an API key
	expires time.Time // the calling lease's expiry; zero: none (or an API key)
}

// authorize checks c for sandbox id and scope need: 401 for missing, bad,
// expired or revoked credentials, 403 for another sandbox's token or too
// low a scope, 404 for an unknown sandbox (only after the token verified).
//
// A lease token only names a lease: its sandbox, scope and expiry are
// those of the Lease in the store. The MAC proves the token came from
// someone holding the secret, not that its claims are true; a token whose
// claims differ from the lease it names (say, owner scope for an operate
// lease, or a later expiry) was never minted by this gateway and is
// refused with 401, as is one naming another sandbox's lease.
// Caller must not hold s.mu.
func (s *Service) authorize(c Caller, id string, need Scope) (access, error) {
	tok := c.Lease
	if tok == "" {
		tok = c.Bearer
	}
	if tok == "" {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "a lease token or API key is required")
	}
	if !strings.HasPrefix(tok, tokenPrefix) {
		fp, ok := s.apiKey(tok)
		if !ok {
			return access{}, providers.Errorf(providers.ErrUnauthorized, "invalid credentials")
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		b := s.boxes[id]
		if b == nil {
			return access{}, errSandboxNotFound(id)
		}
		if b.rec.Creator != fp {
			return access{}, providers.Errorf(providers.ErrForbidden, "this API key did not create sandbox %s", id)
		}
		return access{box: b, scope: ScopeOwner}, nil
	}
	cl, err := s.sign.verify(tok)
	if err != nil {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "invalid lease token")
	}
	// These two use the claims only to keep the order of the answers (an
	// expired or misdirected token says so before the sandbox's existence
	// is revealed); the stored lease decides below.
	now := s.opts.Clock.Now()
	if !cl.Expires.IsZero() && !now.Before(cl.Expires) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token expired")
	}
	if cl.SandboxID != id {
		return access{}, providers.Errorf(providers.ErrForbidden, "lease token is for another sandbox")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[id]
	if b == nil {
		return access{}, errSandboxNotFound(id)
	}
	l, ok := s.leases[cl.LeaseID]
	if !ok {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token was revoked")
	}
	if l.SandboxID != cl.SandboxID || l.Scope != cl.Scope || !sameSecond(l.ExpiresAt, cl.Expires) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "invalid lease token")
	}
	if !l.ExpiresAt.IsZero() && !now.Before(l.ExpiresAt) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token expired")
	}
	if !l.Scope.covers(need) {
		return access{}, providers.Errorf(providers.ErrForbidden, "this needs a lease of scope %s", need)
	}
	return access{box: b, scope: l.Scope, leaseID: l.ID, expires: l.ExpiresAt}, nil
}

// sameSecond reports whether a and b are the same expiry as a token
// carries it: both none, or the same Unix second.
func sameSecond(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() == b.IsZero()
	}
	return a.Unix() == b.Unix()
}

// apiKey reports whether tok is a configured API key, and its fingerprint.
func (s *Service) apiKey(tok string) (string, bool) {
	fp := keyFingerprint(tok)
	ok := false
	for k := range s.keys {
		// Every key is compared so the time taken does not say which matched.
		if subtle.ConstantTimeCompare([]byte(k), []byte(fp)) == 1 {
			ok = true
		}
	}
	return fp, ok
}

// authorizeKey checks the credentials for create and list and returns the
// creator fingerprint ("" for an anonymous caller).
func (s *Service) authorizeKey(c Caller) (string, error) {
	if c.Bearer == "" {
		if s.opts.AllowAnonymous && len(s.keys) == 0 {
			return "", nil
		}
		return "", providers.Errorf(providers.ErrUnauthorized, "an API key is required (Authorization: Bearer <key>)")
	}
	if len(s.keys) == 0 && s.opts.AllowAnonymous {
		return "", nil
	}
	fp, ok := s.apiKey(c.Bearer)
	if !ok {
		return "", providers.Errorf(providers.ErrUnauthorized, "invalid API key")
	}
	return fp, nil
}

func errSandboxNotFound(id string) error {
	return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
}

// CreateRequest is a validated-by-schema create body; Create validates the
// rest. Durations are nil when the client sent nothing (or null).
type CreateRequest struct {
	Image           string
	TTL             *time.Duration
	IdleTimeout     *time.Duration
	ReadyTimeout    *time.Duration
	Workdir         string
	Env             map[string]string
	Files           map[string]string
	Metadata        map[string]string
	Resources       providers.Resources
	Entrypoint      []string
	Ports           []int
	ProviderOptions map[string]any
}

// Ref is what create and mint return: a sandbox and one token for it.
type Ref struct {
	SandboxID string
	Token     string
	LeaseID   string
	Scope     Scope
	Provider  string
	Workdir   string
	ExpiresAt time.Time // lease expiry; zero: none
	Extra     map[string]any
}

const defaultWorkdir = "/workspace"

func (r *CreateRequest) validate() error {
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
	return bad.Err()
}

// Create makes a sandbox, waiting in the capacity queue if the gateway is
// full, and returns an owner lease for it. It returns only once the
// sandbox is ready and its files are written; on failure nothing is left.
func (s *Service) Create(ctx context.Context, c Caller, req CreateRequest) (Ref, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return Ref{}, err
	}
	if err := req.validate(); err != nil {
		return Ref{}, err
	}
	if err := s.slots.acquire(ctx, s.opts.QueueTimeout); err != nil {
		s.m.CreatesTotal.WithLabelValues(s.p.Name(), "unavailable").Inc()
		return Ref{}, err
	}
	start := time.Now()
	ref, err := s.create(ctx, creator, req)
	if err != nil {
		s.slots.release()
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

func (s *Service) create(ctx context.Context, creator string, req CreateRequest) (Ref, error) {
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
	sb, err := s.p.Create(ctx, providers.CreateSpec{
		ID:           id,
		Image:        req.Image,
		Workdir:      req.Workdir,
		Env:          req.Env,
		Resources:    req.Resources,
		Entrypoint:   req.Entrypoint,
		Ports:        req.Ports,
		Options:      req.ProviderOptions,
		ReadyTimeout: ready,
	})
	if err != nil {
		return Ref{}, fmt.Errorf("create sandbox: %w", err)
	}
	for _, p := range sortedKeys(req.Files) {
		if _, err = s.p.WriteFile(ctx, id, resolve(sb.Workdir, p), strings.NewReader(req.Files[p])); err != nil {
			err = fmt.Errorf("write file %q: %w", p, err)
			break
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
	}
	if ttl > 0 {
		rec.ExpiresAt = now.Add(ttl)
	}
	if req.IdleTimeout != nil {
		rec.IdleTimeout = *req.IdleTimeout
	}
	lease := Lease{ID: newLeaseID(), SandboxID: id, Scope: ScopeOwner, CreatedAt: now}
	if err == nil {
		err = s.st.putRecord(rec, &lease)
	}
	if err != nil {
		// Detached: the client's context may be what failed.
		if derr := s.p.Delete(context.WithoutCancel(ctx), id); derr != nil {
			s.log.Error("delete half-made sandbox", "sandbox", id, "err", derr)
		}
		return Ref{}, err
	}
	s.mu.Lock()
	s.boxes[id] = &box{rec: rec, lastActivity: now, hasSlot: true}
	s.leases[lease.ID] = lease
	s.mu.Unlock()
	s.log.Info("sandbox created", "sandbox", id, "provider", s.p.Name(), "duration", now.Sub(start))
	return s.ref(rec, lease), nil
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

// Info is the public view of a sandbox.
type Info struct {
	Record
	LastActivity time.Time
}

func (b *box) info() Info { return Info{Record: b.rec, LastActivity: b.lastActivity} }

// ListFilter selects sandboxes; zero fields match everything.
type ListFilter struct {
	Status providers.State
	Label  string // "k=v": metadata k equals v
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
	a, err := s.authorize(c, id, ScopeOperate)
	if err != nil {
		return Info{}, err
	}
	s.refresh(ctx, a.box)
	s.mu.Lock()
	defer s.mu.Unlock()
	return a.box.info(), nil
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
	s.setState(b, got)
}

// setState records a new state for b and frees its slot when it stops.
func (s *Service) setState(b *box, state providers.State) {
	s.mu.Lock()
	b.rec.State = state
	rec := b.rec
	release := b.hasSlot && !state.Live()
	if release {
		b.hasSlot = false
	}
	s.mu.Unlock()
	if release {
		s.slots.release()
	}
	if err := s.st.putRecord(rec, nil); err != nil {
		s.log.Error("persist sandbox state", "sandbox", rec.ID, "err", err)
	}
}

// Mint returns a new lease for the sandbox. An operate caller can mint only
// operate leases. ttl nil: the lease lives as long as the sandbox.
//
// A lease never outlives the lease that mints it: when the caller's lease
// expires, ttl nil means the caller's expiry, and a ttl that would end
// after it is refused (ErrInvalid on ttl_s, naming the time the caller's
// lease has left) rather than silently shortened. An API key has no
// expiry of its own and mints any ttl.
func (s *Service) Mint(ctx context.Context, c Caller, id string, scope Scope, ttl *time.Duration) (Ref, error) {
	if scope == "" {
		scope = ScopeOperate
	}
	if !scope.valid() {
		return Ref{}, providers.InvalidFields{{Field: "scope", Message: "must be owner or operate"}}
	}
	if ttl != nil && *ttl <= 0 {
		return Ref{}, providers.InvalidFields{{Field: "ttl_s", Message: "must be positive"}}
	}
	a, err := s.authorize(c, id, scope)
	if err != nil {
		return Ref{}, err
	}
	now := s.opts.Clock.Now()
	l := Lease{ID: newLeaseID(), SandboxID: id, Scope: scope, CreatedAt: now}
	if ttl != nil {
		l.ExpiresAt = now.Add(*ttl).Truncate(time.Second)
	}
	if parent := a.expires; !parent.IsZero() {
		switch {
		case ttl == nil:
			l.ExpiresAt = parent
		case l.ExpiresAt.After(parent):
			return Ref{}, providers.InvalidFields{{Field: "ttl_s", Message: fmt.Sprintf(
				"must not outlive the calling lease, which has %d s left", int64(parent.Sub(now)/time.Second))}}
		}
	}
	if err := s.st.putLease(l); err != nil {
		return Ref{}, err
	}
	s.mu.Lock()
	s.leases[l.ID] = l
	rec := a.box.rec
	s.mu.Unlock()
	return s.ref(rec, l), nil
}

// Release revokes the caller's own lease and returns how many leases the
// sandbox has left.
func (s *Service) Release(ctx context.Context, c Caller, id string) (int, error) {
	a, err := s.authorize(c, id, ScopeOperate)
	if err != nil {
		return 0, err
	}
	if a.leaseID == "" {
		return 0, providers.Errorf(providers.ErrConflict, "release revokes the calling lease token; an API key has none")
	}
	if err := s.st.deleteLease(id, a.leaseID); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.leases, a.leaseID)
	n := 0
	for _, l := range s.leases {
		if l.SandboxID == id {
			n++
		}
	}
	return n, nil
}

// Renew sets the sandbox's expiry to now + ttl (nil: its current TTL;
// 0: no expiry).
func (s *Service) Renew(ctx context.Context, c Caller, id string, ttl *time.Duration) (Info, error) {
	if ttl != nil && *ttl < 0 {
		return Info{}, providers.InvalidFields{{Field: "ttl_s", Message: "must not be negative"}}
	}
	a, err := s.authorize(c, id, ScopeOwner)
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
	rec := b.rec
	info := b.info()
	s.mu.Unlock()
	return info, s.st.putRecord(rec, nil)
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
	a, err := s.authorize(c, id, ScopeOwner)
	if err != nil {
		return Info{}, err
	}
	p, ok := s.p.(providers.Pauser)
	if !ok {
		return Info{}, providers.Errorf(providers.ErrUnsupported, "pause is not supported by provider %s", s.p.Name())
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
	s.setState(a.box, to)
	s.touch(a.box)
	s.mu.Lock()
	defer s.mu.Unlock()
	return a.box.info(), nil
}

// Endpoint returns how to reach a port declared at create.
func (s *Service) Endpoint(ctx context.Context, c Caller, id string, port int) (providers.Endpoint, error) {
	a, err := s.authorize(c, id, ScopeOperate)
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
	a, err := s.authorize(c, id, ScopeOwner)
	if err != nil {
		return err
	}
	return s.remove(ctx, a.box, "deleted")
}

// remove deletes the sandbox from the provider, then from the registry.
// When the provider fails the sandbox stays so the delete can be retried.
func (s *Service) remove(ctx context.Context, b *box, why string) error {
	id := b.rec.ID
	if err := s.p.Delete(ctx, id); err != nil && !errors.Is(err, providers.ErrNotFound) {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	s.mu.Lock()
	if s.boxes[id] != b {
		s.mu.Unlock()
		return errSandboxNotFound(id) // a concurrent delete won
	}
	delete(s.boxes, id)
	for lid, l := range s.leases {
		if l.SandboxID == id {
			delete(s.leases, lid)
		}
	}
	release := b.hasSlot
	b.hasSlot = false
	b.rec.State = providers.StateStopped
	hooks := s.onRemove
	s.mu.Unlock()
	if release {
		s.slots.release()
	}
	for _, f := range hooks {
		f(id)
	}
	s.m.DeletesTotal.WithLabelValues(why).Inc()
	if err := s.st.deleteSandbox(id); err != nil {
		s.log.Error("forget sandbox", "sandbox", id, "err", err)
	}
	s.log.Info("sandbox removed", "sandbox", id, "why", why)
	return nil
}

// touch records activity on b now.
func (s *Service) touch(b *box) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	b.lastActivity = now
	s.mu.Unlock()
}

// begin marks a request in flight on b (so it is not idle) after checking
// that b can take one; end must be called when the request is done.
func (s *Service) begin(b *box) (end func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st := b.rec.State; st {
	case providers.StateRunning:
	case providers.StatePaused:
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is paused", b.rec.ID)
	default:
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", b.rec.ID, st)
	}
	b.busy++
	b.lastActivity = s.opts.Clock.Now()
	return func() {
		s.mu.Lock()
		b.busy--
		b.lastActivity = s.opts.Clock.Now()
		s.mu.Unlock()
	}, nil
}

// Hold marks a client attached to sandbox id (a PTY viewer): the sandbox
// is not idle while held. The returned func releases the hold.
func (s *Service) Hold(id string) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[id]
	if b == nil {
		return func() {}
	}
	b.holds++
	return func() {
		s.mu.Lock()
		b.holds--
		b.lastActivity = s.opts.Clock.Now()
		s.mu.Unlock()
	}
}

// Touch records activity on sandbox id (e.g. PTY output).
func (s *Service) Touch(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.boxes[id]; b != nil {
		b.lastActivity = s.opts.Clock.Now()
	}
}

// resolve makes p absolute against workdir. p has passed checkPath.
func resolve(workdir, p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	return path.Join(workdir, p)
}

// checkPath refuses paths that are empty, hold a NUL, or step up with "..".
func checkPath(p string) error {
	switch {
	case p == "":
		return errors.New("must not be empty")
	case strings.ContainsRune(p, 0):
		return errors.New("must not contain a NUL byte")
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return errors.New(`must not contain ".." (paths may not step out of the sandbox)`)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

var _ io.Reader // files.go
