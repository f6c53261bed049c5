package pty

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"fmt"
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

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/wire"
)

// Service is what the manager needs of the sandbox service
// (*sandbox.Service implements it).
type Service interface {
	// SessionHost authorises c (operate) and returns where sandbox id's
	// terminal sessions live: its agent, or one the service runs in
	// process for a provider without.
	SessionHost(ctx context.Context, c sandbox.Caller, id string) (*agentclient.Client, error)
	// ProcessSpec authorises c and validates spec for sandbox id,
	// resolving its cwd against the sandbox's workdir.
	ProcessSpec(ctx context.Context, c sandbox.Caller, id string, spec providers.ProcessSpec) (providers.ProcessSpec, error)
	// Access authorises c to operate sandbox id (401/403/404).
	Access(ctx context.Context, c sandbox.Caller, id string) error
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
	QueueBytes     int           // a client's outgoing queue; default 4 MiB; full while the client takes nothing for 2 s = close 1008
	MaxFrame       int           // largest client frame; default 64 KiB; larger ones get an error frame
	PingInterval   time.Duration // default 20 s
	IdleTimeout    time.Duration // a client silent this long is dropped; default 60 s
	WriteTimeout   time.Duration // per frame; default 10 s
	MaxSessions    int           // sessions in all, until deleted; default 4096 (503 beyond)
	MaxPerSandbox  int           // sessions in one sandbox, until deleted; default 256 (429 beyond)
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

// Manager serves the terminal sessions of every sandbox. The sessions
// themselves (process, retained output, exit status) live in a session
// host per sandbox, its agent, and outlive the gateway; the manager keeps
// what is about connections: which client holds a session, takeover, the
// WebSocket protocol, and the limits. It is safe for concurrent use.
//
// It owns every goroutine of this package: each connection's writer,
// pinger and feeder, and it counts the Attach calls themselves, since
// http.Server.Shutdown does not wait for hijacked connections. Close ends
// them all and waits.
type Manager struct {
	svc  Service
	opts Options
	log  *slog.Logger
	met  *metrics.Metrics
	out  prometheus.Counter // bytes of process output
	in   prometheus.Counter // bytes of client input
	// releaseAfter is how long a client's writer waits for output before
	// it lets large queue buffers go (see keepSpare); stallAfter is how long
	// a client may take nothing before it is closed as too slow (see push).
	// Tests change them.
	releaseAfter time.Duration
	stallAfter   time.Duration

	mu      sync.Mutex           // guards everything below
	holders map[skey]*client     // the client attached to a running session
	counts  map[string]int       // sessions by sandbox, once listed or created here
	count   int                  // sessions in all (of the sandboxes in counts)
	clients map[*client]struct{} // connected clients
	closed  bool
	// starting and startingAll count the creates between their limit
	// check and their session's start (a round trip to the host), by
	// sandbox id and in all: they hold their slots, so concurrent creates
	// cannot overshoot the limits.
	starting    map[string]int
	startingAll int

	wg sync.WaitGroup // every goroutine and Attach call; Add only under mu while !closed
}

// skey names a session.
type skey struct{ sandbox, session string }

// NewManager returns a manager over svc and registers with svc to close a
// sandbox's clients when it is removed. It starts no goroutine.
func NewManager(svc Service, opts Options) *Manager {
	opts.defaults()
	m := &Manager{
		svc:      svc,
		opts:     opts,
		log:      opts.Logger,
		met:      opts.Metrics,
		out:      opts.Metrics.PTYBytesTotal.WithLabelValues("out"),
		in:       opts.Metrics.PTYBytesTotal.WithLabelValues("in"),
		holders:  map[skey]*client{},
		counts:   map[string]int{},
		clients:  map[*client]struct{}{},
		starting: map[string]int{},

		releaseAfter: releaseAfter,
		stallAfter:   stallAfter,
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

// host authorises c and returns sandbox id's session host, and the
// number of sessions it holds once known.
func (m *Manager) host(ctx context.Context, c sandbox.Caller, id string) (*agentclient.Client, error) {
	h, err := m.svc.SessionHost(ctx, c, id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	_, known := m.counts[id]
	m.mu.Unlock()
	if known {
		return h, nil
	}
	list, err := h.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	// The list comes from the sandbox (its root can replace the agent):
	// it counts for no more than one sandbox's share, or a liar could
	// use up every other sandbox's sessions.
	n := min(len(list), m.opts.MaxPerSandbox)
	m.mu.Lock()
	if _, known := m.counts[id]; !known {
		m.counts[id] = n
		m.count += n
		m.met.PTYSessions.Add(float64(n))
	}
	m.mu.Unlock()
	return h, nil
}

// Create makes a session in sandbox id for caller c, its process started
// now or at the first attach; its output is retained from the first byte.
// Errors: those of the service (401/403/404, 409 wrong state or no PTY
// support, 400), ErrTooMany at MaxPerSandbox, and ErrUnavailable at
// MaxSessions or when shutting down.
func (m *Manager) Create(ctx context.Context, c sandbox.Caller, id string, spec providers.ProcessSpec, at Start) (Info, error) {
	spec, err := m.svc.ProcessSpec(ctx, c, id, spec)
	if err != nil {
		return Info{}, err
	}
	h, err := m.host(ctx, c, id)
	if err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	closed := m.closed
	full := m.count+m.startingAll >= m.opts.MaxSessions
	fullHere := m.counts[id]+m.starting[id] >= m.opts.MaxPerSandbox
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
	if at == StartAtAttach {
		spec.TTY = true // the mode until the first attach says otherwise
	}
	si, err := h.StartSession(ctx, newSessionID(), spec, at == StartAtAttach, m.opts.RingBytes)
	m.mu.Lock()
	m.startingAll--
	if m.starting[id]--; m.starting[id] == 0 {
		delete(m.starting, id)
	}
	if err == nil {
		if _, known := m.counts[id]; known {
			m.counts[id]++
			m.count++
			m.met.PTYSessions.Inc()
		}
	}
	m.mu.Unlock()
	if err != nil {
		return Info{}, fmt.Errorf("start process in %s: %w", id, err)
	}
	return m.info(id, si), nil
}

// info describes session si of sandbox id.
func (m *Manager) info(id string, si agentwire.SessionInfo) Info {
	i := Info{
		ID: si.ID, Running: si.Running, OutputOffset: si.OutputOffset,
		ExitCode: si.ExitCode, Mode: wire.ModePipe, CreatedAt: si.CreatedAt,
	}
	if si.TTY {
		i.Mode = wire.ModePTY
	}
	m.mu.Lock()
	i.Attached = m.holders[skey{id, si.ID}] != nil
	m.mu.Unlock()
	return i
}

// Get describes session sid of sandbox id. Unknown session: *Error with
// CONTEXT_NOT_FOUND (404).
func (m *Manager) Get(ctx context.Context, c sandbox.Caller, id, sid string) (Info, error) {
	list, err := m.List(ctx, c, id)
	if err != nil {
		return Info{}, err
	}
	for _, i := range list {
		if i.ID == sid {
			return i, nil
		}
	}
	return Info{}, errSessionNotFound(sid)
}

// List describes the sessions of sandbox id, oldest first.
func (m *Manager) List(ctx context.Context, c sandbox.Caller, id string) ([]Info, error) {
	h, err := m.host(ctx, c, id)
	if err != nil {
		return nil, err
	}
	list, err := h.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Info, len(list))
	for i, si := range list {
		out[i] = m.info(id, si)
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
// frame SESSION_GONE, close 1001) and forgets it.
func (m *Manager) Delete(ctx context.Context, c sandbox.Caller, id, sid string) error {
	h, err := m.host(ctx, c, id)
	if err != nil {
		return err
	}
	// The holder hears SESSION_GONE, not the exit the kill causes.
	m.mu.Lock()
	cl := m.holders[skey{id, sid}]
	delete(m.holders, skey{id, sid})
	m.mu.Unlock()
	if cl != nil {
		cl.closeWith(causeGone)
	}
	if err := h.DeleteSession(ctx, sid); err != nil {
		if providers.Kind(err) == providers.ErrNotFound {
			return errSessionNotFound(sid)
		}
		return err
	}
	m.mu.Lock()
	if n, known := m.counts[id]; known && n > 0 {
		m.counts[id]--
		m.count--
		m.met.PTYSessions.Dec()
	}
	m.mu.Unlock()
	return nil
}

// removeSandbox closes the clients of a removed sandbox's sessions
// (SESSION_GONE) and forgets its count, without waiting.
func (m *Manager) removeSandbox(id string) {
	m.mu.Lock()
	var cs []*client
	for k, cl := range m.holders {
		if k.sandbox == id {
			cs = append(cs, cl)
			delete(m.holders, k)
		}
	}
	for cl := range m.clients {
		if cl.sandboxID == id {
			cs = append(cs, cl)
		}
	}
	if n, known := m.counts[id]; known {
		m.count -= n
		m.met.PTYSessions.Sub(float64(n))
		delete(m.counts, id)
	}
	m.mu.Unlock()
	for _, cl := range cs {
		cl.closeWith(causeGone)
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

// Close shuts down (clients get 1001) and waits for every goroutine and
// attached connection to finish. The sessions live on in their hosts.
func (m *Manager) Close() error {
	m.Shutdown()
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
	if err := m.svc.Access(r.Context(), c, req.SandboxID); err != nil {
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
	m.wg.Add(1)
	m.mu.Unlock()
	defer m.wg.Done()

	h, err := m.host(r.Context(), c, req.SandboxID)
	if err != nil {
		return err
	}
	k := skey{req.SandboxID, req.SessionID}
	m.mu.Lock()
	held := m.holders[k] != nil
	m.mu.Unlock()
	if held && !req.Takeover {
		return errAlreadyConnected(req.SessionID)
	}
	att, err := h.Attach(r.Context(), req.SessionID, req.Since, req.PTY, m.opts.RingBytes)
	if err != nil {
		if providers.Kind(err) == providers.ErrNotFound {
			return errSessionNotFound(req.SessionID)
		}
		return err
	}
	cl := newClient(m, req.SandboxID, req.SessionID, att)
	if len(att.Replay) > 0 {
		cl.replay = wire.AppendReplay(make([]byte, 0, wire.ReplayHeader+len(att.Replay)), att.From, att.Replay)
		att.Replay = nil // up to a whole ring: an idle client must not keep it
	}
	if !att.Info.Running && att.Info.ExitCode != nil {
		code := *att.Info.ExitCode
		cl.exit = &code // all its output is in the replay; it holds nothing
	} else {
		m.mu.Lock()
		old := m.holders[k]
		if old != nil && !req.Takeover {
			m.mu.Unlock()
			att.Close()
			return errAlreadyConnected(req.SessionID)
		}
		m.holders[k] = cl
		cl.holding = true
		m.mu.Unlock()
		if old != nil {
			old.closeWith(causeTakenOver)
		}
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
		m.detach(cl) // Accept has answered the request
		att.Close()
		m.log.Debug("terminal attach: upgrade failed", "sandbox", req.SandboxID, "session", req.SessionID, "err", err)
		return nil
	}
	conn.SetReadLimit(hardReadLimit)
	cl.conn = conn
	m.serve(r.Context(), cl)
	return nil
}

// detach forgets cl as its session's holder, if it still is.
func (m *Manager) detach(cl *client) {
	m.mu.Lock()
	if k := (skey{cl.sandboxID, cl.sid}); m.holders[k] == cl {
		delete(m.holders, k)
	}
	m.mu.Unlock()
}

// serve runs an upgraded connection: the writer, the pinger and (for a
// holder) the feeder on their own goroutines, the reader on this one, and
// joins them.
func (m *Manager) serve(parent context.Context, cl *client) {
	m.mu.Lock()
	m.clients[cl] = struct{}{}
	if m.closed {
		cl.closeWith(causeShutdown)
	}
	m.mu.Unlock()
	release := m.svc.Hold(cl.sandboxID)
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
	fed := make(chan struct{})
	if cl.holding {
		go func() {
			defer close(fed)
			cl.feed()
		}()
	} else {
		close(fed)
	}
	err := cl.readLoop(ctx)
	cancel(err)
	wg.Wait()
	cl.conn.CloseNow()
	cl.leave()
	cl.att.Close()
	<-fed

	m.detach(cl)
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
	m.log.Debug("terminal client left", "sandbox", cl.sandboxID, "session", cl.sid, "why", context.Cause(ctx))
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
