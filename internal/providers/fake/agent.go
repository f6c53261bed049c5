package fake

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

var _ agentclient.Provider = (*Provider)(nil)

// Agent returns the connection to sandbox id's agent, as the real
// providers do: here an agent server in the test's own process, started
// on first use and ended with the sandbox (Delete, Stop, Vanish, Close).
// Its commands really run, as children of the test process, with cwd and
// paths under a temporary directory that stands for the sandbox's root
// (the sandbox's workdir exists there). Errors: ErrNotFound, ErrConflict
// (not running), or ctx's error while another call starts the agent.
//
// The agent's reaper waits for every child of the process: a test that
// uses terminal sessions of the fake must not wait for children of its
// own (os/exec) at the same time.
func (p *Provider) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	p.mu.Lock()
	b, err := p.get(id)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	h := b.agent
	first := h == nil
	if first {
		h = &host{ready: make(chan struct{})}
		b.agent = h
	}
	workdir := b.workdir
	p.mu.Unlock()
	if first {
		h.start(workdir)
		close(h.ready)
		if h.err != nil {
			p.mu.Lock()
			if b.agent == h {
				b.agent = nil
			}
			p.mu.Unlock()
		}
	}
	select {
	case <-h.ready:
		return h.c, h.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// host is one sandbox's in-process agent: a server on one end of a pipe,
// the client on the other.
type host struct {
	ready  chan struct{} // closed when start returned: c or err is set
	c      *agentclient.Client
	err    error
	srv    *agent.Server
	root   string
	served chan struct{} // closed when srv.Serve returned
}

// start makes the sandbox's root directory (with workdir in it) and
// connects to a new server. It needs no context: nothing in it waits on
// anything but this process.
func (h *host) start(workdir string) {
	if workdir == "" {
		workdir = "/" // an adopted sandbox
	}
	root, err := os.MkdirTemp("", "sandgate-fake-")
	if err == nil {
		err = os.MkdirAll(filepath.Join(root, workdir), 0o755)
	}
	if err != nil {
		os.RemoveAll(root)
		h.err = providers.Wrap(providers.ErrUnavailable, err, "fake sandbox root")
		return
	}
	h.root = root
	h.srv = agent.NewServerWith(acquireReaper(), agent.Options{
		Env:     []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + workdir},
		Workdir: workdir,
		Root:    root,
	})
	a, c := net.Pipe()
	h.served = make(chan struct{})
	go func() {
		defer close(h.served)
		h.srv.Serve(a, nil)
	}()
	h.c, h.err = agentclient.Dial(context.Background(), c)
	if h.err != nil {
		c.Close()
		h.end()
	}
}

// end closes the connection, kills every session's process and removes
// the root. It waits for start to have returned.
func (h *host) end() {
	if h.c != nil {
		h.c.Close()
	}
	<-h.served
	h.srv.Close()
	releaseReaper()
	os.RemoveAll(h.root)
}

// dropAgent forgets sandbox b's agent and returns it for ending (nil:
// none). Caller holds p.mu.
func (b *sandbox) dropAgent() *host {
	h := b.agent
	b.agent = nil
	return h
}

// endAgents ends hosts (from dropAgent) after their start finished.
// Caller must not hold p.mu: a starting host waits for nothing of the
// provider's, but ending one waits for its sessions to be killed.
func endAgents(hs ...*host) {
	for _, h := range hs {
		if h == nil {
			continue
		}
		<-h.ready
		if h.err == nil {
			h.end()
		}
	}
}

// reaper is the process's one reaper of children, shared by the agents of
// every fake sandbox: a reaper waits for any child (it is the agent's
// sole waiter), so two would each take children the other started. It
// runs while some agent does. Package state because a process has one set
// of children.
var reaper struct {
	mu sync.Mutex
	r  *agent.Reaper
	n  int
}

func acquireReaper() *agent.Reaper {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if reaper.n == 0 {
		reaper.r = agent.NewReaper(false)
	}
	reaper.n++
	return reaper.r
}

func releaseReaper() {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if reaper.n--; reaper.n == 0 {
		reaper.r.Close()
		reaper.r = nil
	}
}
