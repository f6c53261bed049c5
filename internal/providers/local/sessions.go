package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	sgagent "github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// Terminal sessions live in the sandbox's init, which serves package
// agent's protocol on a second socket in the sandbox's directory
// (sessions.sock, bound by the gateway like agent.sock): init holds each
// session's process, terminal or pipes, retained output and exit status,
// so the sessions outlive the gateway as the sandbox does.

var _ agentclient.Provider = (*Local)(nil)

// serveSessions runs init's agent server (commands and terminal
// sessions, package agent) until the listener closes. Its commands fork
// on the forker thread and init's reaper reaps them; they start from the
// sandbox's environment in its workdir.
func (a *agent) serveSessions(l net.Listener) {
	root, _ := lookupUser("")
	o := sgagent.Options{ForkOn: a.onForker, Env: commandEnv(envList(a.cfg.Env, nil), root), Workdir: a.cfg.Workdir}
	if a.cfg.Isolation == IsolationNone {
		o.Root = a.cfg.Dir + "/fs"
	}
	srv := sgagent.NewServerWith(a.reaper, o)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			fmt.Fprintf(os.Stderr, "sandgate init: sessions: accept: %v\n", err)
			continue
		}
		go srv.Serve(c, nil)
	}
}

// Agent returns the gateway's connection to sandbox id's session host,
// its init, connecting when there is none or it broke. A host that broke
// the protocol (sandbox root can replace it) is not reconnected: the
// sandbox is in error (ErrConflict) until deleted.
func (l *Local) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, err
	}
	sb.hostMu.Lock()
	defer sb.hostMu.Unlock()
	if c := sb.host; c != nil {
		if why := c.Violation(); why != "" {
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, why)
		}
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	conn, err := sb.dialSessions(ctx)
	if err != nil {
		if s := sb.state(); s != providers.StateRunning {
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, s)
		}
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": its session host does not answer")
	}
	// Each attachment gets a connection of its own: output and keystrokes
	// skip the multiplexer.
	c, err := agentclient.Dial(ctx, conn, agentclient.WithDirect(func(ctx context.Context) (net.Conn, error) { return sb.dialSessions(ctx) }))
	if err != nil {
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": its session host")
	}
	sb.host = c
	return c, nil
}

// hostViolation is why the gateway cut its connection to sb's session
// host for breaking the protocol, or "".
func (sb *sandbox) hostViolation() string {
	sb.hostMu.Lock()
	defer sb.hostMu.Unlock()
	if sb.host == nil {
		return ""
	}
	return sb.host.Violation()
}

// dialSessions connects to init's session host.
func (sb *sandbox) dialSessions(ctx context.Context) (net.Conn, error) {
	addr, d, err := sockAddrOf(sb.dir, sessionsSocket)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	var dialer net.Dialer
	return dialer.DialContext(ctx, "unix", addr)
}

// dropHost closes the gateway's connection to sb's session host. A host
// that broke the protocol is kept (its connection is closed already): it
// is why the sandbox is in error.
func (sb *sandbox) dropHost() {
	sb.hostMu.Lock()
	c := sb.host
	if c != nil && c.Violation() != "" {
		sb.hostMu.Unlock()
		return
	}
	sb.host = nil
	sb.hostMu.Unlock()
	if c != nil {
		c.Close()
	}
}
