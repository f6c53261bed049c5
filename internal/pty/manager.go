package pty

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/wire"
)

// Service is what the manager needs of the sandbox service
// (*sandbox.Service implements it).
type Service interface {
	// StartProcess authorises c (operate) and starts a process.
	StartProcess(ctx context.Context, c sandbox.Caller, id string, spec providers.ProcessSpec) (providers.Process, error)
	// Access authorises c to operate sandbox id (401/403/404).
	Access(c sandbox.Caller, id string) error
	// Hold marks a client attached (the sandbox is not idle) until release.
	Hold(id string) (release func())
	// Touch records activity on the sandbox.
	Touch(id string)
	// OnRemove registers f to run when a sandbox is removed.
	OnRemove(f func(id string))
}

var _ Service = (*sandbox.Service)(nil)

// Options configure a Manager. Zero values take the defaults named.
type Options struct {
	RingBytes int // output retained per session; default 1 MiB
	// AllowedOrigins are the browser origins allowed to attach besides
	// the gateway's own: patterns matched with path.Match against the
	// Origin's host, or against scheme://host when the pattern has "://".
	AllowedOrigins []string
	QueueBytes     int           // a client's outgoing queue; default 4 MiB; full = close 1008
	MaxFrame       int           // largest client frame; default 64 KiB; larger ones get an error frame
	PingInterval   time.Duration // default 20 s
	IdleTimeout    time.Duration // a client silent this long is dropped; default 60 s
	WriteTimeout   time.Duration // per frame; default 10 s
	DrainGrace     time.Duration // output read after the process exited; default 250 ms
	MaxSessions    int           // live sessions in all; default 4096 (503 beyond)
	MaxPerSandbox  int           // live sessions in one sandbox; default 256 (429 beyond)
	Logger         *slog.Logger
	Metrics        *metrics.Metrics // default metrics.Discard()
}

func (o *Options) defaults() {
	if o.Metrics == nil {
		o.Metrics = metrics.Discard()
	}
	if o.MaxPerSandbox <= 0 {
		o.MaxPerSandbox = 256
	}
	if o.RingBytes <= 0 {
		o.RingBytes = 1 << 20
	}
	if o.QueueBytes <= 0 {
		o.QueueBytes = 4 << 20
	}
	if o.MaxFrame <= 0 {
		o.MaxFrame = 64 << 10
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 20 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 60 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.DrainGrace <= 0 {
		o.DrainGrace = 250 * time.Millisecond
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 4096
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// hardReadLimit is where the WebSocket library itself gives up on a
// client message (close 1009); below it, frames over MaxFrame are read
// and discarded and answered with an error frame.
const hardReadLimit = 16 << 20

// Manager holds the terminal sessions of every sandbox and serves their
// WebSocket attaches. It is safe for concurrent use.
//
// It owns every goroutine of this package: each session's readers and
// owner, and each connection's writer and pinger, and it counts the
// Attach calls themselves, since http.Server.Shutdown does not wait for
// hijacked connections. Close ends them all and waits.
type Manager struct {
	svc  Service
	opts Options
	log  *slog.Logger
	met  *metrics.Metrics
	out  prometheus.Counter // bytes of process output
	in   prometheus.Counter // bytes of client input

	mu       sync.Mutex                     // guards sessions, count, starting, clients, closed
	sessions map[string]map[string]*Session // sandbox id -> session id -> session
	count    int
	// starting and startingAll count the creates between their limit
	// check and their entry in sessions (the process start is a round trip
	// to the backend), by sandbox id and in all: they hold their slots, so
	// concurrent creates cannot overshoot the limits.
	starting    map[string]int
	startingAll int
	clients     map[*client]struct{} // connected clients
	closed      bool

	wg sync.WaitGroup // every goroutine and Attach call; Add only under mu while !closed
}

// NewManager returns a manager over svc and registers with svc to end a
// sandbox's sessions when it is removed. It starts no goroutine.
func NewManager(svc Service, opts Options) *Manager {
	opts.defaults()
	m := &Manager{
		svc:      svc,
		opts:     opts,
		log:      opts.Logger,
		met:      opts.Metrics,
		out:      opts.Metrics.PTYBytesTotal.WithLabelValues("out"),
		in:       opts.Metrics.PTYBytesTotal.WithLabelValues("in"),
		sessions: map[string]map[string]*Session{},
		starting: map[string]int{},
		clients:  map[*client]struct{}{},
	}
	svc.OnRemove(m.removeSandbox)
	return m
}

func errShuttingDown() error {
	return providers.Errorf(providers.ErrUnavailable, "the gateway is shutting down")
}

var idEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

func newSessionID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "pty-" + strings.ToLower(idEncoding.EncodeToString(b))
}

// Start is when a session's process starts.
type Start int

const (
	// StartNow starts it at create, in spec's mode, so that output from
	// before any attach is retained (a create that names its mode).
	StartNow Start = iota
	// StartAtAttach starts it at the first attach, in the mode that attach
	// asks for (a create that names no mode: OpenSandbox execd's clients
	// choose pipe mode with ?pty=0 on the WebSocket).
	StartAtAttach
)

// Create makes a session in sandbox id for caller c, its process started
// now or at the first attach; its output is retained from the first byte.
// Errors: those of the service (401/403/404, 409 wrong state or no PTY
// support, 400), and ErrUnavailable when at MaxSessions or shutting down.
func (m *Manager) Create(ctx context.Context, c sandbox.Caller, id string, spec providers.ProcessSpec, at Start) (Info, error) {
	m.mu.Lock()
	closed := m.closed
	full := m.count+m.startingAll >= m.opts.MaxSessions
	fullHere := len(m.sessions[id])+m.starting[id] >= m.opts.MaxPerSandbox
	if !closed && !full && !fullHere {
		m.starting[id]++
		m.startingAll++
	}
	m.mu.Unlock()
	switch {
	case closed:
		return Info{}, errShuttingDown()
	case full:
		m.met.Refused.WithLabelValues("pty").Inc()
		return Info{}, providers.Errorf(providers.ErrUnavailable, "too many terminal sessions (%d)", m.opts.MaxSessions)
	case fullHere:
		m.met.Refused.WithLabelValues("pty").Inc()
		return Info{}, providers.Errorf(providers.ErrTooMany, "sandbox %s already has %d terminal sessions (the limit); delete one first", id, m.opts.MaxPerSandbox)
	}
	var proc providers.Process
	var err error
	if at == StartAtAttach {
		if err = m.svc.Access(c, id); err == nil {
			spec.TTY = true // the mode until the first attach says otherwise
			proc = newDeferred(func(ctx context.Context, c sandbox.Caller, tty bool) (providers.Process, error) {
				s := spec
				s.TTY = tty
				return m.svc.StartProcess(ctx, c, id, s)
			})
		}
	} else {
		proc, err = m.svc.StartProcess(ctx, c, id, spec)
	}
	if err != nil {
		m.mu.Lock()
		m.started(id)
		m.mu.Unlock()
		return Info{}, err
	}
	s := &Session{
		id:        newSessionID(),
		sandboxID: id,
		mode:      wire.ModePipe,
		created:   time.Now(),
		proc:      proc,
		m:         m,
		ring:      wire.NewRing(m.opts.RingBytes),
		drained:   make(chan struct{}),
		done:      make(chan struct{}),
	}
	if spec.TTY {
		s.mode = wire.ModePTY
	}
	m.mu.Lock()
	m.started(id)
	if m.closed {
		m.mu.Unlock()
		proc.Kill()
		proc.Wait()
		return Info{}, errShuttingDown()
	}
	if m.sessions[id] == nil {
		m.sessions[id] = map[string]*Session{}
	}
	m.sessions[id][s.id] = s
	m.count++
	m.met.PTYSessions.Inc()
	m.wg.Add(s.goroutines())
	m.mu.Unlock()
	s.start()
	return s.Info(), nil
}

// started releases the slot a create held while its process started.
// Caller holds m.mu.
func (m *Manager) started(id string) {
	m.startingAll--
	if m.starting[id]--; m.starting[id] == 0 {
		delete(m.starting, id)
	}
}

// sessionDone is the last act of a session's owner: the session no
// longer counts against MaxSessions.
func (m *Manager) sessionDone() {
	m.mu.Lock()
	m.count--
	m.mu.Unlock()
	m.met.PTYSessions.Dec()
}

// lookup authorises c and finds session sid of sandbox id.
func (m *Manager) lookup(c sandbox.Caller, id, sid string) (*Session, error) {
	if err := m.svc.Access(c, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	s := m.sessions[id][sid]
	m.mu.Unlock()
	if s == nil {
		return nil, errSessionNotFound(sid)
	}
	return s, nil
}

// Get describes session sid of sandbox id. Unknown session: *Error with
// CONTEXT_NOT_FOUND (404).
func (m *Manager) Get(c sandbox.Caller, id, sid string) (Info, error) {
	s, err := m.lookup(c, id, sid)
	if err != nil {
		return Info{}, err
	}
	return s.Info(), nil
}

// List describes the sessions of sandbox id, oldest first.
func (m *Manager) List(c sandbox.Caller, id string) ([]Info, error) {
	if err := m.svc.Access(c, id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	ss := make([]*Session, 0, len(m.sessions[id]))
	for _, s := range m.sessions[id] {
		ss = append(ss, s)
	}
	m.mu.Unlock()
	out := make([]Info, len(ss))
	for i, s := range ss {
		out[i] = s.Info()
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Delete kills session sid's process group, closes its client (error
// frame SESSION_GONE, close 1001) and forgets it. It blocks until the
// session is torn down (bounded by DrainGrace and the kill).
func (m *Manager) Delete(ctx context.Context, c sandbox.Caller, id, sid string) error {
	s, err := m.lookup(c, id, sid)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.sessions[id][sid] != s {
		m.mu.Unlock()
		return errSessionNotFound(sid) // a concurrent delete won
	}
	m.forget(s)
	m.mu.Unlock()
	s.end(causeGone)
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// forget removes s from the maps. Caller holds m.mu.
func (m *Manager) forget(s *Session) {
	delete(m.sessions[s.sandboxID], s.id)
	if len(m.sessions[s.sandboxID]) == 0 {
		delete(m.sessions, s.sandboxID)
	}
}

// removeSandbox ends every session of a removed sandbox without waiting
// (it runs on the service's removing goroutine).
func (m *Manager) removeSandbox(id string) {
	m.mu.Lock()
	ss := m.sessions[id]
	delete(m.sessions, id)
	m.mu.Unlock()
	for _, s := range ss {
		s.end(causeGone)
	}
}

// Shutdown starts closing every connected client with 1001 and refuses
// new sessions and attaches. It does not wait (see Close); it suits
// http.Server.RegisterOnShutdown.
func (m *Manager) Shutdown() {
	m.mu.Lock()
	m.closed = true
	cs := make([]*client, 0, len(m.clients))
	for c := range m.clients {
		cs = append(cs, c)
	}
	m.mu.Unlock()
	for _, c := range cs {
		c.closeWith(causeShutdown)
	}
}

// Close shuts down (clients get 1001), kills every session's process and
// waits for every goroutine and attached connection to finish. Sandboxes
// are not touched.
func (m *Manager) Close() error {
	m.Shutdown()
	m.mu.Lock()
	var ss []*Session
	for id, byID := range m.sessions {
		for _, s := range byID {
			ss = append(ss, s)
		}
		delete(m.sessions, id)
	}
	m.mu.Unlock()
	for _, s := range ss {
		s.end(causeShutdown)
	}
	m.wg.Wait()
	return nil
}

// AttachRequest is a parsed WebSocket attach.
type AttachRequest struct {
	SandboxID, SessionID string
	Since                int64 // replay from this absolute offset (>= 0)
	Takeover             bool  // evict the current holder with 4001 instead of refusing
	// PTY is the mode the client asks for (?pty=0/1; nil: not said). It
	// picks the mode of a session whose process starts at this, its first
	// attach; a running process keeps its mode.
	PTY *bool
	// Subprotocol is the subprotocol the client offered that carried its
	// lease (sandgate.lease.<token>); the server selects it. "" = none.
	Subprotocol string
}

// Attach serves a WebSocket attach to a session. Before the upgrade it
// checks, in order: c's access to the sandbox (401/403/404), the Origin
// (403), the session (404 CONTEXT_NOT_FOUND), the holder (409
// ALREADY_CONNECTED without takeover); such errors are returned for the
// caller to render and nothing was written. After a successful upgrade it
// serves the connection until it ends and returns nil; it blocks that
// long. With takeover the previous holder is closed with 4001 while this
// client is attached at once.
func (m *Manager) Attach(w http.ResponseWriter, r *http.Request, c sandbox.Caller, req AttachRequest) error {
	if err := m.svc.Access(c, req.SandboxID); err != nil {
		return err
	}
	if err := m.checkOrigin(r); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errShuttingDown()
	}
	s := m.sessions[req.SandboxID][req.SessionID]
	if s == nil {
		m.mu.Unlock()
		return errSessionNotFound(req.SessionID)
	}
	m.wg.Add(1)
	m.mu.Unlock()
	defer m.wg.Done()

	if d, ok := s.proc.(*deferred); ok {
		tty := req.PTY == nil || *req.PTY
		started, err := d.start(r.Context(), c, tty)
		if err != nil {
			return err
		}
		if started && !tty {
			s.setMode(wire.ModePipe)
		}
	}
	cl := newClient(s)
	if err := s.attach(cl, req.Since, req.Takeover); err != nil {
		return err
	}
	opts := &websocket.AcceptOptions{
		// Origin was checked above, with problem+json refusals.
		InsecureSkipVerify: true,
		OnPongReceived: func(context.Context, []byte) {
			cl.lastSeen.Store(time.Now().UnixNano())
		},
	}
	if req.Subprotocol != "" {
		opts.Subprotocols = []string{req.Subprotocol}
	}
	conn, err := websocket.Accept(w, r, opts)
	if err != nil {
		s.detach(cl) // Accept has answered the request
		m.log.Debug("terminal attach: upgrade failed", "sandbox", req.SandboxID, "session", req.SessionID, "err", err)
		return nil
	}
	conn.SetReadLimit(hardReadLimit)
	cl.conn = conn
	m.serve(r.Context(), cl)
	return nil
}

// serve runs an upgraded connection: the writer and pinger on their own
// goroutines, the reader on this one, and joins them.
func (m *Manager) serve(parent context.Context, cl *client) {
	s := cl.s
	m.mu.Lock()
	m.clients[cl] = struct{}{}
	if m.closed {
		cl.closeWith(causeShutdown)
	}
	m.mu.Unlock()
	release := m.svc.Hold(s.sandboxID)
	m.met.PTYAttachments.Inc()
	defer m.met.PTYAttachments.Dec()

	ctx, cancel := context.WithCancelCause(parent)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		cancel(cl.writeLoop(ctx))
	}()
	go func() {
		defer wg.Done()
		cl.pingLoop(ctx)
	}()
	err := cl.readLoop(ctx)
	cancel(err)
	wg.Wait()
	cl.conn.CloseNow()

	s.detach(cl)
	release()
	m.mu.Lock()
	delete(m.clients, cl)
	m.mu.Unlock()
	cl.mu.Lock()
	cause := cl.cause
	cl.mu.Unlock()
	if why := dropReason(cause); why != "" {
		m.met.PTYDropped.WithLabelValues(why).Inc()
	}
	m.log.Debug("terminal client left", "sandbox", s.sandboxID, "session", s.id, "why", context.Cause(ctx))
}

// dropReason names, for the metrics, why the gateway closed a client;
// "" when it did not (the client left) or the session ended.
func dropReason(cause *closeCause) string {
	switch cause {
	case causeSlow:
		return "slow"
	case causeSilent:
		return "silent"
	case causeTakenOver:
		return "taken_over"
	case causeShutdown:
		return "shutdown"
	}
	return ""
}

// checkOrigin allows requests without an Origin (non-browser clients),
// same-origin requests, and origins matching AllowedOrigins.
func (m *Manager) checkOrigin(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return providers.Errorf(providers.ErrForbidden, "bad Origin header")
	}
	if strings.EqualFold(u.Host, r.Host) {
		return nil
	}
	for _, p := range m.opts.AllowedOrigins {
		target := u.Host
		if strings.Contains(p, "://") {
			target = u.Scheme + "://" + u.Host
		}
		if ok, err := path.Match(strings.ToLower(p), strings.ToLower(target)); err == nil && ok {
			return nil
		}
	}
	return providers.Errorf(providers.ErrForbidden, "origin %s is not allowed to attach (see --allowed-origins)", wire.Truncate(origin, 128))
}
