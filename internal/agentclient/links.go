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
type Links struct {
	// Open opens a stream to sandbox id's agent bridge ("connect", with
	// --start when start). stderr returns what the bridge said on its
	// standard error so far.
	Open func(ctx context.Context, id string, start bool) (conn io.ReadWriteCloser, stderr func() string, err error)
	// Running returns nil when sandbox id is running, else its state as
	// an error (ErrNotFound, ErrConflict).
	Running func(ctx context.Context, id string) error

	mu     sync.Mutex
	byID   map[string]*Client
	broken map[string]string
	dialMu sync.Mutex // serialises connecting: a connect is one backend exec, and rare
}

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
	if c, err := l.cached(id); c != nil || err != nil {
		return c, err
	}
	l.dialMu.Lock()
	defer l.dialMu.Unlock()
	if c, err := l.cached(id); c != nil || err != nil {
		return c, err
	}
	return l.connect(ctx, id, start)
}

func (l *Links) cached(id string) (*Client, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noteViolation(id)
	if why := l.broken[id]; why != "" {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, why)
	}
	if c := l.byID[id]; c != nil {
		select {
		case <-c.Done():
			delete(l.byID, id)
		default:
			return c, nil
		}
	}
	return nil, nil
}

// connect opens a connection to sandbox id's agent. Caller holds dialMu.
func (l *Links) connect(ctx context.Context, id string, start bool) (*Client, error) {
	conn, stderr, err := l.Open(ctx, id, start)
	if err != nil {
		if serr := l.settled(context.WithoutCancel(ctx), id); serr != nil {
			return nil, serr // stopped or gone: that is the answer
		}
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	c, err := Dial(dctx, conn)
	cancel()
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if serr := l.settled(context.WithoutCancel(ctx), id); serr != nil {
			return nil, serr
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
			l.mu.Lock()
			if l.broken == nil {
				l.broken = map[string]string{}
			}
			l.broken[id] = why
			l.mu.Unlock()
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, why)
		}
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": cannot reach its agent: "+why)
	}
	l.mu.Lock()
	if l.byID == nil {
		l.byID = map[string]*Client{}
	}
	l.byID[id] = c
	l.mu.Unlock()
	return c, nil
}

// noteViolation marks sandbox id broken when its agent broke the protocol
// (the connection is closed then: no reconnect can be trusted). Caller
// holds mu.
func (l *Links) noteViolation(id string) {
	c := l.byID[id]
	if c == nil {
		return
	}
	if why := c.Violation(); why != "" {
		delete(l.byID, id)
		if l.broken == nil {
			l.broken = map[string]string{}
		}
		l.broken[id] = why
	}
}

// Drop closes and forgets sandbox id's connection and broken mark (its
// sandbox is being deleted).
func (l *Links) Drop(id string) {
	l.mu.Lock()
	c := l.byID[id]
	delete(l.byID, id)
	delete(l.broken, id)
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Broken is why sandbox id's agent is gone, or "".
func (l *Links) Broken(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noteViolation(id)
	return l.broken[id]
}

// Close closes every connection.
func (l *Links) Close() {
	l.mu.Lock()
	cs := l.byID
	l.byID = nil
	l.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
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
	l.dialMu.Lock()
	defer l.dialMu.Unlock()
	if c, cerr := l.cached(id); c != nil || cerr != nil {
		if cerr != nil {
			return cerr
		}
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": the connection to its agent broke; try again")
	}
	if _, cerr := l.connect(ctx, id, false); cerr != nil {
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
