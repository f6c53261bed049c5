// Package sandbox is the service behind the API: the registry of sandboxes,
// leases and their tokens, TTL and idle reaping, the capacity queue,
// persistence, and dispatch to one provider. Every method that acts on a
// sandbox takes the caller's credentials and checks them first, in the order
// 401 -> 403 -> 404, so that sandbox ids cannot be probed.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"github.com/sandgate/sandgate/internal/egress"
	"io"
	"log/slog"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
)

// Clock tells the time; tests inject a fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Options configure a Service. Zero values take the defaults named.
type Options struct {
	Provider providers.Provider // required
	StateDir string             // required: holds sandgate.db and lease.key
	// Pools are the warm pools to keep (see pools.go).
	Pools []PoolSpec
	// Store keeps records and leases; nil = sandgate.db in StateDir. A
	// SharedStore (several replicas) is read again on every call.
	Store          Store
	LeaseSecret    string   // "" = persisted random secret in StateDir
	APIKeys        []string // keys allowed to create and list
	AllowAnonymous bool     // no key needed to create/list (loopback only; decided by the caller)

	MaxSandboxes        int           // default 64
	QueueTimeout        time.Duration // default 600s: how long a create waits for capacity
	DefaultTTL          time.Duration // default 1800s; negative = no expiry
	DefaultReadyTimeout time.Duration // default 60s
	DefaultExecTimeout  time.Duration // default 180s
	MaxExecOutput       int           // default 16 MiB per stream
	MaxExecOutputTotal  int64         // default 256 MiB: output held at once by the execs of one API key until released (see Exec); all keys' together at most 4 times this
	MaxExecs            int           // concurrent execs in all sandboxes; default 1024
	MaxExecsPerSandbox  int           // concurrent execs in one sandbox; default 256
	ReapInterval        time.Duration // default 1s
	// CommandRetention is how long a sandbox's agent keeps a durable
	// command (its output and result) after it ended; default 1 h.
	CommandRetention time.Duration
	// Ceilings bound what a request may ask for (see Ceilings); zero
	// fields are none.
	Ceilings Ceilings
	// VolumeRoots are the host directories under which a create may mount
	// a host_path (none: no host paths).
	VolumeRoots []string
	// CapAddAllow are the capabilities (names without CAP_, upper case) a
	// create's cap_add may name; none: every cap_add is refused.
	CapAddAllow []string

	// Budget is the gateway-wide admission budget (zero: none); Quotas
	// are each API key's (zero: none). A create commits its resources'
	// memory_mib and disk_gib, or DefaultMemoryMiB and DefaultDiskGiB
	// (what the provider applies when a create sets none; 0: nothing).
	Budget           Budget
	Quotas           Quotas
	DefaultMemoryMiB int64
	DefaultDiskGiB   float64

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
		o.DefaultExecTimeout = providers.DefaultExecTimeout
	}
	if o.MaxExecOutput <= 0 {
		o.MaxExecOutput = providers.DefaultMaxOutput
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
	if o.CommandRetention <= 0 {
		o.CommandRetention = DefaultCommandRetention
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
	opts   Options
	p      providers.Provider
	st     Store
	shared SharedStore // st, when other replicas write it too; else nil
	sign   signer
	keys   map[string]bool // fingerprints of the API keys
	slots  *slots
	log    *slog.Logger
	m      *metrics.Metrics

	mu     sync.Mutex      // guards boxes and leases, and every box's fields
	boxes  map[string]*box // live and stopped sandboxes with a record
	leases map[string]Lease
	snaps  map[string]Snapshot
	vols   volumes
	execs  int // execs in flight in all sandboxes (MaxExecs)

	out *outputBudget // MaxExecOutputTotal per key

	pools      map[string]*pool // by PoolSpec.Key; nil without pools
	poolCancel context.CancelFunc
	poolWG     sync.WaitGroup

	onRemove []func(id string) // see OnRemove

	// names are the group names being claimed by creates in flight
	// (groupID/name → sandbox id), guarded by mu: a name is taken when a
	// live member of the group has it or a create holds it here.
	names map[string]string
	// hostsMu orders the writes of /etc/hosts files (groups.go), so that
	// the last one written is from the newest membership.
	hostsMu sync.Mutex

	stop      chan struct{}
	reaperWG  sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// box is the in-memory half of a sandbox's state. Fields are guarded by
// Service.mu.
type box struct {
	rec          Record
	lastActivity time.Time
	busy         int     // requests in flight (exec, files): never idle while > 0
	execs        int     // execs in flight (MaxExecsPerSandbox)
	holds        int     // attached clients (PTY): never idle while > 0
	slot         *demand // what it holds of MaxSandboxes, the budget and its key's quotas; nil: nothing
	removing     bool    // a remove of this replica is in flight: it unregisters the box, not forget

	// wmu orders the writes of rec to the store (see persist); it is
	// taken before mu, never while holding it.
	wmu sync.Mutex
}

// Caller is a request's credentials, as the transport found them.
type Caller struct {
	Lease  string // from X-NeMo-Gym-Sandbox-Lease, X-Sandbox-Lease, ?lease= or the WS subprotocol
	Bearer string // from Authorization: Bearer: an API key or a lease token

	fresh   string    // the sandbox Authenticate read the store for ("" = none)
	freshAt time.Time // when
}

// New opens the store in opts.StateDir, reconciles it with the provider
// (adopting live sandboxes, marking vanished ones stopped, deleting
// labelled orphans) and starts the reaper.
func New(ctx context.Context, opts Options) (*Service, error) {
	opts.defaults()
	if opts.Provider == nil || opts.StateDir == "" {
		return nil, errors.New("sandbox service needs a provider and a state dir")
	}
	if err := opts.Ceilings.checkDefaults(opts.DefaultTTL); err != nil {
		return nil, err
	}
	secret, err := loadSecret(opts.LeaseSecret, opts.StateDir)
	if err != nil {
		return nil, err
	}
	st := opts.Store
	if st == nil {
		if st, err = store.Open(opts.StateDir); err != nil {
			return nil, err
		}
	}
	shared, _ := st.(SharedStore)
	s := &Service{
		opts:   opts,
		p:      opts.Provider,
		st:     st,
		shared: shared,
		sign:   signer{secret: secret},
		keys:   map[string]bool{},
		slots:  newSlots(opts.MaxSandboxes),
		log:    opts.Logger,
		m:      opts.Metrics,
		boxes:  map[string]*box{},
		names:  map[string]string{},
		leases: map[string]Lease{},
		snaps:  map[string]Snapshot{},
		out:    newOutputBudget(opts.MaxExecOutputTotal),
		stop:   make(chan struct{}),
	}
	s.slots.budget, s.slots.quota = opts.Budget, opts.Quotas
	s.slots.refused = func(kind string) { s.m.QuotaRefusals.WithLabelValues(kind).Inc() }
	for _, k := range opts.APIKeys {
		if k != "" {
			s.keys[keyFingerprint(k)] = true
		}
	}
	if err := s.reconcile(ctx); err != nil {
		st.Close()
		return nil, err
	}
	if err := s.loadSnapshots(ctx); err != nil {
		st.Close()
		return nil, err
	}
	s.releaseSnapshots(ctx)
	if err := s.loadVolumes(ctx); err != nil {
		st.Close()
		return nil, err
	}
	if err := s.startPools(ctx, opts.Pools); err != nil {
		st.Close()
		return nil, err
	}
	s.m.WatchPools(s.PoolReady)
	s.m.WatchSandboxes(s.countStates, s.slots.waiting)
	s.m.WatchAdmission(s.slots.committed)
	s.reaperWG.Add(1)
	go s.reaper()
	return s, nil
}

// Close stops the reaper and closes the store. Sandboxes keep running and
// are adopted by the next Service on the same state dir.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		s.stopPools()
		close(s.stop)
		s.reaperWG.Wait()
		s.closeErr = s.st.Close()
	})
	return s.closeErr
}

// ProviderName is the name of the provider the service dispatches to.
func (s *Service) ProviderName() string { return s.p.Name() }

// Ready reports whether the store is open and the provider answers.
func (s *Service) Ready(ctx context.Context) error {
	if err := s.st.Ping(ctx); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "the state store is not open")
	}
	if err := s.p.Ping(ctx); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "provider "+s.p.Name()+" is not answering")
	}
	return nil
}

func (s *Service) reconcile(ctx context.Context) error {
	recs, leases, err := s.st.Load(ctx)
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
			d := s.demandOf(r.Creator, r.Resources)
			b.slot = &d
			s.slots.take(d)
		case ok && state == providers.StateError && r.State.Live():
			// It ended while the gateway was down, and the provider can
			// tell how (a local init killed by a signal).
			b.rec.State = state
			if sr, ok := s.p.(providers.StateReasoner); ok {
				b.rec.StateReason = sr.StateReason(r.ID)
			}
		case r.State == providers.StateStarting && s.shared != nil && now.Sub(r.CreatedAt) < provisionalLife:
			// Another replica's create in flight: its sandbox is not
			// there yet.
		case r.State.Live():
			s.log.Info("sandbox vanished while the gateway was down", "sandbox", r.ID)
			b.rec.State = providers.StateStopped
		}
		if b.rec.State != r.State {
			if err := s.st.PutRecord(ctx, b.rec, nil); err != nil {
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
	s.restoreEgress(ctx)
	s.restoreGroups(ctx)
	for id := range have {
		if s.shared != nil {
			// Another replica's create that began after the Load above:
			// its record came before its sandbox, so it is there now.
			if _, _, err := s.shared.Sandbox(ctx, id); !errors.Is(err, providers.ErrNotFound) {
				if err != nil {
					s.log.Warn("read the record of a sandbox without one", "sandbox", id, "err", err)
				}
				continue
			}
		}
		s.log.Info("deleting orphan sandbox with no record", "sandbox", id)
		if err := s.p.Delete(ctx, id); err != nil && !errors.Is(err, providers.ErrNotFound) {
			s.log.Warn("delete orphan", "sandbox", id, "err", err)
		}
	}
	if sw, ok := s.p.(providers.Sweeper); ok {
		if err := sw.Sweep(ctx); err != nil {
			s.log.Warn("sweep leftovers of gone sandboxes", "provider", s.p.Name(), "err", err)
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
	SnapshotID      string // start from this snapshot ("" = the image)
	// ShmSize sizes /dev/shm: bytes (a JSON number) or a size string
	// (parseShmSize); nil: the provider's default.
	ShmSize  any
	shmBytes int64 // ShmSize, set by validate

	// Volumes are mounted at create (NeMo Gym's provider_options.volumes
	// are added to them).
	Volumes []VolumeRequest

	mounts    []providers.VolumeMount // Volumes resolved by prepare
	volumeIDs []string                // the volumes they use

	// Egress is the sandbox's egress policy (nil or none: no network
	// beyond what the provider gives without one).
	Egress *egress.Policy

	// Group names the sandbox's group ("": none), Hostname its host name
	// ("": DefaultHostname), Aliases further names its group knows it by.
	// CapAdd are capabilities it keeps (NeMo Gym's provider_options.cap_add
	// is moved here); validate normalises them (upper case, no CAP_).
	Group    string
	Hostname string
	Aliases  []string
	CapAdd   []string

	// PauseOnExpiry pauses the sandbox at its TTL instead of stopping it
	// (E2B's autoPause); it then stays paused with no expiry until
	// resumed. A provider that cannot pause refuses it (ErrUnsupported).
	PauseOnExpiry bool
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

// Info is the public view of a sandbox.
type Info struct {
	Record
	LastActivity time.Time
	// EgressStats are the sandbox's connections through the egress point
	// (Get only, for a sandbox with a policy on a provider that counts).
	EgressStats *egress.Stats
}

func (b *box) info() Info { return Info{Record: b.rec, LastActivity: b.lastActive()} }

// ListFilter selects sandboxes; zero fields match everything.
type ListFilter struct {
	Status providers.State
	Label  string // "k=v": metadata k equals v
}

// touch records activity on b now.
func (s *Service) touch(b *box) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	b.lastActivity = now
	s.mu.Unlock()
	s.shareActivity(b, now)
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
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s%s", b.rec.ID, st, reason(b.rec.StateReason))
	}
	b.busy++
	b.lastActivity = s.opts.Clock.Now()
	return func() {
		s.mu.Lock()
		b.busy--
		now := s.opts.Clock.Now()
		b.lastActivity = now
		s.mu.Unlock()
		s.shareActivity(b, now)
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

// reason is ": why" for an error message, "" without one.
func reason(why string) string {
	if why == "" {
		return ""
	}
	return ": " + why
}
