package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// Links are a provider's connections to its sandboxes' agents, one per
// sandbox, for a provider that reaches an agent through a byte stream its
// backend opens (an exec of the agent's bridge: Docker, Kubernetes). A
// connection is made on first use (after a gateway restart too) and again
// when it broke; a sandbox whose agent is gone (or mismatched, or broke
// the protocol: Client.Violation) is marked broken, with why, and its
// calls answer ErrConflict.
//
// Connecting is per sandbox: concurrent calls for one sandbox share one
// connect, and no lock is held across the backend's open or the dial, so
// a sandbox whose exec hangs (at its pids limit) delays no other. A
// connect runs until its deadline (ConnectTimeout) or until every caller
// waiting for it has given up.
type Links struct {
	// Open opens a stream to sandbox id's agent bridge ("connect", with
	// --start when start). stderr returns what the bridge said on its
	// standard error so far.
	Open func(ctx context.Context, id string, start bool) (conn io.ReadWriteCloser, stderr func() string, err error)
	// Running returns nil when sandbox id is running, else its state as
	// an error (ErrNotFound, ErrConflict).
	Running func(ctx context.Context, id string) error
	// Options, when set, are the client options for a connection Open
	// made (WithDirect for one that is a unix socket to the agent).
	Options func(id string, conn io.ReadWriteCloser) []Option

	mu     sync.Mutex // guards byID, closed and every link's fields
	byID   map[string]*link
	closed bool
	dials  sync.WaitGroup // the connects in flight; Close waits for them
}

// link is one sandbox's connection state.
type link struct {
	c      *Client  // the connection; nil before the first and after it ended
	broken string   // why the sandbox's agent is gone; "" while it is not
	dial   *dialing // the connect in flight, or nil
}

// dialing is one connect, shared by the callers waiting for it.
type dialing struct {
	done    chan struct{} // closed when c or err is set
	c       *Client
	err     error
	cancel  context.CancelFunc
	waiters int // callers still waiting; guarded by Links.mu
}

// ConnectTimeout bounds one connect: the backend's open of the bridge
// and the protocol's hello.
const ConnectTimeout = 50 * time.Second

// dialTimeout bounds the hello on a stream the backend opened.
const dialTimeout = 20 * time.Second

// Get returns the connection to sandbox id's agent, connecting when there
// is none or it broke. A sandbox whose agent is gone is ErrConflict with
// the reason.
func (l *Links) Get(ctx context.Context, id string) (*Client, error) {
	return l.get(ctx, id, false)
}

// Start is Get for a new sandbox: a missing agent daemon is started.
func (l *Links) Start(ctx context.Context, id string) (*Client, error) {
	return l.get(ctx, id, true)
}

func (l *Links) get(ctx context.Context, id string, start bool) (*Client, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, providers.Errorf(providers.ErrUnavailable, "the provider is closed")
	}
	if l.byID == nil {
		l.byID = map[string]*link{}
	}
	e := l.byID[id]
	if e == nil {
		e = &link{}
		l.byID[id] = e
	}
	if c, err := e.cached(id); c != nil || err != nil {
		l.mu.Unlock()
		return c, err
	}
	d := e.dial
	if d == nil {
		// The connect outlives a caller that gives up while others wait:
		// it runs on its own context, cancelled when the last leaves.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ConnectTimeout)
		d = &dialing{done: make(chan struct{}), cancel: cancel}
		e.dial = d
		l.dials.Add(1)
		go l.connect(dctx, e, d, id, start)
	}
	d.waiters++
	l.mu.Unlock()
	select {
	case <-d.done:
		return d.c, d.err
	case <-ctx.Done():
		l.mu.Lock()
		if d.waiters--; d.waiters == 0 {
			d.cancel()
		}
		l.mu.Unlock()
		return nil, ctx.Err()
	}
}

// cached is the live connection or the broken mark. Caller holds mu.
func (e *link) cached(id string) (*Client, error) {
	e.noteViolation()
	if e.broken != "" {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, e.broken)
	}
	if e.c != nil {
		select {
		case <-e.c.Done():
			e.c = nil
		default:
			return e.c, nil
		}
	}
	return nil, nil
}

// connect makes d's connection to sandbox id's agent and installs it in
// e, unless e was dropped meanwhile.
func (l *Links) connect(ctx context.Context, e *link, d *dialing, id string, start bool) {
	defer l.dials.Done()
	defer d.cancel()
	c, broken, err := l.dial(ctx, id, start)
	l.mu.Lock()
	e.dial = nil
	current := l.byID[id] == e && !l.closed
	if current {
		if broken != "" {
			e.broken = broken
		} else if err == nil {
			e.c = c
		}
	}
	l.mu.Unlock()
	if c != nil && !current {
		c.Close()
		c, err = nil, providers.Errorf(providers.ErrConflict, "sandbox %s is being deleted", id)
	}
	d.c, d.err = c, err
	close(d.done)
}

// dial opens a connection to sandbox id's agent. A non-empty broken is
// why the sandbox is broken (err says so too).
func (l *Links) dial(ctx context.Context, id string, start bool) (c *Client, broken string, err error) {
	c, broken, err = l.dialOnce(ctx, id, start)
	if !start && broken == "" && errors.Is(err, ErrGone) && ctx.Err() == nil {
		// The connection ended before the hello's answer: an agent on
		// its way out (its listener still took the connection). Once
		// more, which finds it gone, or back.
		c, broken, err = l.dialOnce(ctx, id, start)
	}
	return c, broken, err
}

func (l *Links) dialOnce(ctx context.Context, id string, start bool) (c *Client, broken string, err error) {
	conn, stderr, err := l.Open(ctx, id, start)
	if err != nil {
		if serr := l.settled(context.WithoutCancel(ctx), id); serr != nil {
			return nil, "", serr // stopped or gone: that is the answer
		}
		return nil, "", err
	}
	var opts []Option
	if l.Options != nil {
		opts = l.Options(id, conn)
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	c, err = Dial(dctx, conn, opts...)
	cancel()
	if err == nil {
		return c, "", nil
	}
	conn.Close()
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	if serr := l.settled(context.WithoutCancel(ctx), id); serr != nil {
		return nil, "", serr
	}
	why := strings.TrimSpace(stderr())
	if why == "" {
		why = err.Error()
	}
	// Only a mismatched agent, or a bridge that found no agent where one
	// was started, means the sandbox is broken; anything else (a bridge
	// that could not start under load) may pass.
	if strings.Contains(why, "protocol") || (!start && strings.Contains(why, "no agent answers")) {
		if !start {
			why = "its agent is not running (killed or exited): " + why
		}
		return nil, why, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, why)
	}
	return nil, "", providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": cannot reach its agent: "+why)
}

// noteViolation marks the sandbox broken when its agent broke the
// protocol (the connection is closed then: no reconnect can be trusted).
// Caller holds Links.mu.
func (e *link) noteViolation() {
	if e.c == nil {
		return
	}
	if why := e.c.Violation(); why != "" {
		e.c = nil
		e.broken = why
	}
}

// Drop closes and forgets sandbox id's connection and broken mark (its
// sandbox is being deleted); a connect in flight is cancelled and its
// connection, if made, closed.
func (l *Links) Drop(id string) {
	l.mu.Lock()
	e := l.byID[id]
	delete(l.byID, id)
	var c *Client
	if e != nil {
		c = e.c
		if e.dial != nil {
			e.dial.cancel()
		}
	}
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Broken is why sandbox id's agent is gone, or "".
func (l *Links) Broken(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID[id]
	if e == nil {
		return ""
	}
	e.noteViolation()
	return e.broken
}

// Close closes every connection, cancels the connects in flight and
// waits for them. Get answers ErrUnavailable afterwards.
func (l *Links) Close() {
	l.mu.Lock()
	l.closed = true
	all := l.byID
	l.byID = nil
	for _, e := range all {
		if e.dial != nil {
			e.dial.cancel()
		}
	}
	l.mu.Unlock()
	for _, e := range all {
		if e.c != nil {
			e.c.Close()
		}
	}
	l.dials.Wait()
}

// Gone maps an error of a call on sandbox id's connection: a connection
// that ended is the sandbox stopping (its state, from Running) or its
// agent dying (the sandbox is then broken); after a reconnect the call
// may be retried (ErrUnavailable, "try again").
func (l *Links) Gone(ctx context.Context, id string, err error) error {
	if !errors.Is(err, ErrGone) {
		return err
	}
	// The caller's call failed, but this check must finish, in bounded time.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ReconnectTimeout)
	defer cancel()
	if serr := l.Running(ctx, id); serr != nil {
		return serr
	}
	if _, cerr := l.get(ctx, id, false); cerr != nil {
		return cerr
	}
	return providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": the connection to its agent broke; try again")
}

// settled is Running after a connection to the agent failed: a sandbox
// being killed reads as running for a moment after its processes died
// (the backend has not noticed yet), so a running answer is asked again
// every 50 ms for up to settleTime before it counts.
func (l *Links) settled(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, settleTime)
	defer cancel()
	for {
		err := l.Running(ctx, id)
		if ctx.Err() != nil {
			return nil // still running as far as the backend said
		}
		if err != nil {
			return err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

const settleTime = 2 * time.Second

// ReconnectTimeout bounds the check and reconnect after a connection
// broke (a sandbox at its pids limit can make an exec hang).
const ReconnectTimeout = 30 * time.Second

// Probe connects to sandbox id's agent, starting it (a new sandbox), and
// runs a command in workdir through it: the image must have /bin/sh and
// workdir. An ErrInvalid names the sandbox.
func (l *Links) Probe(ctx context.Context, id, workdir string) error {
	c, err := l.Start(ctx, id)
	if err != nil {
		return err
	}
	res, err := c.Exec(ctx, providers.ExecRequest{Command: ":", Cwd: workdir, Timeout: 30 * time.Second, MaxOutput: 4 << 10})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("probe exited %d: %s", res.ExitCode, res.Stderr)
	}
	if providers.Kind(err) == providers.ErrInvalid {
		return providers.Wrap(providers.ErrInvalid, err, "sandbox "+id+": "+providers.Message(err))
	}
	return err
}

// Stderr keeps the first Max bytes written to it (a bridge's standard
// error, for Links.Open); safe for concurrent use.
type Stderr struct {
	Max int
	mu  sync.Mutex
	buf []byte
}

func (b *Stderr) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.Max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *Stderr) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
