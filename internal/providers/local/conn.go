package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// A sandbox's init is its agent: it serves package agent's protocol (the
// one every provider speaks) on a unix socket in the sandbox's directory,
// bound by the gateway and handed to init. Init holds each terminal
// session's process, terminal or pipes, retained output and exit status,
// so the sessions outlive the gateway as the sandbox does. Each call that
// streams (a terminal attachment, a file) gets a direct connection of its
// own; a file is passed as its descriptor.

var _ agentclient.Provider = (*Local)(nil)

// sockAddr is the agent socket's path, shortened through /proc/self/fd
// when it would not fit a sockaddr_un; the returned file (if any) must stay
// open while the path is used.
func sockAddr(dir string) (string, *os.File, error) {
	p := dir + "/" + socketName
	if len(p) < 100 {
		return p, nil, nil
	}
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), socketName), d, nil
}

// listenAgent binds the agent's socket in dir and returns it as a file to
// hand to init.
func listenAgent(dir string) (*os.File, error) {
	addr, d, err := sockAddr(dir)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // the socket outlives this listener: init serves it
	f, err := ln.File()
	ln.Close()
	return f, err
}

// dial connects to the sandbox's agent.
func (sb *sandbox) dial(ctx context.Context) (net.Conn, error) {
	addr, d, err := sockAddr(sb.dir)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	var dialer net.Dialer
	return dialer.DialContext(ctx, "unix", addr)
}

// Agent returns the gateway's connection to sandbox id's agent, its
// init (see sandbox.agent).
func (l *Local) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, err
	}
	return sb.agent(ctx)
}

// agent returns the gateway's connection to sb's init, connecting when
// there is none or it broke. An init that broke the protocol (sandbox root
// can replace it) is not reconnected: the sandbox is in error
// (ErrConflict) until deleted.
func (sb *sandbox) agent(ctx context.Context) (*agentclient.Client, error) {
	sb.hostMu.Lock()
	defer sb.hostMu.Unlock()
	if c := sb.host; c != nil {
		if why := c.Violation(); why != "" {
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", sb.id, why)
		}
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	conn, err := sb.dial(ctx)
	if err != nil {
		return nil, sb.unreachable(err)
	}
	c, err := agentclient.Dial(ctx, conn, agentclient.WithDirect(sb.dial))
	if err != nil {
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+sb.id+": its agent")
	}
	sb.host = c
	return c, nil
}

// unreachable is the error for an agent that does not answer: the
// sandbox's state when it is no longer running, else ErrUnavailable.
func (sb *sandbox) unreachable(err error) error {
	if s := sb.state(); s != providers.StateRunning {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is %s", sb.id, s)
	}
	return providers.Wrap(providers.ErrUnavailable, err, "sandbox "+sb.id+": its agent does not answer")
}

// call runs fn on sb's agent connection, mapping a connection that is
// gone to the sandbox's state (and dropping it, to reconnect next time).
func (sb *sandbox) call(ctx context.Context, fn func(c *agentclient.Client) error) error {
	c, err := sb.agent(ctx)
	if err != nil {
		return err
	}
	err = fn(c)
	if err == nil || ctx.Err() != nil {
		return err
	}
	if errors.Is(err, agentclient.ErrGone) {
		sb.dropHost()
		return sb.unreachable(err)
	}
	return err
}

// hostViolation is why the gateway cut its connection to sb's agent for
// breaking the protocol, or "".
func (sb *sandbox) hostViolation() string {
	sb.hostMu.Lock()
	defer sb.hostMu.Unlock()
	if sb.host == nil {
		return ""
	}
	return sb.host.Violation()
}

// dropHost closes the gateway's connection to sb's agent. One that broke
// the protocol is kept (its connection is closed already): it is why the
// sandbox is in error.
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

// clientMsg removes the host part of paths from an agent's message.
func (sb *sandbox) clientMsg(msg string) string {
	if sb.st.Isolation == IsolationNone {
		msg = strings.ReplaceAll(msg, sb.dir+"/fs", "")
	}
	return msg
}
