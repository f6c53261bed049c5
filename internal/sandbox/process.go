package sandbox

import (
	"context"
	"net"
	"sync"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// Access checks that c may operate sandbox id: nil, or the 401/403/404
// error of the check. For routes (WebSocket attach) that act on state the
// service does not hold.
func (s *Service) Access(ctx context.Context, c Caller, id string) error {
	_, err := s.authorize(ctx, c, id, ScopeOperate)
	return err
}

// ProcessSpec authorises c to operate sandbox id and returns spec for a
// process there: cwd checked and resolved against the workdir.
func (s *Service) ProcessSpec(ctx context.Context, c Caller, id string, spec providers.ProcessSpec) (providers.ProcessSpec, error) {
	if spec.Cwd != "" {
		if err := checkPath(spec.Cwd); err != nil {
			return spec, providers.InvalidFields{{Field: "cwd", Message: err.Error()}}
		}
	}
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return spec, err
	}
	if spec.Cwd == "" {
		spec.Cwd = a.box.rec.Workdir
	} else {
		spec.Cwd = resolve(a.box.rec.Workdir, spec.Cwd)
	}
	spec.Env = mergeEnv(a.box.rec.Env, spec.Env)
	return spec, nil
}

// SessionHost authorises c to operate sandbox id, which must be running,
// and returns where its terminal sessions live: the sandbox's agent when
// the provider runs one (the sessions then outlive the gateway), else a
// host this service runs for the sandbox in its own process over the
// provider's processes (they end with the service).
func (s *Service) SessionHost(ctx context.Context, c Caller, id string) (*agentclient.Client, error) {
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return nil, err
	}
	end, err := s.begin(a.box)
	if err != nil {
		return nil, err
	}
	defer end()
	if ap, ok := s.p.(agentclient.Provider); ok {
		return ap.Agent(ctx, id)
	}
	ps, ok := s.p.(providers.ProcessStarter)
	if !ok {
		return nil, providers.Errorf(providers.ErrUnsupported, "terminal sessions are not supported by provider %s", s.p.Name())
	}
	return s.hosts.get(id, func(ctx context.Context, spec providers.ProcessSpec) (providers.Process, error) {
		return ps.StartProcess(ctx, id, spec)
	})
}

// hosts are the in-process session hosts, by sandbox.
type hosts struct {
	mu     sync.Mutex
	byID   map[string]*host
	closed bool
}

// host is an agent.Server in the gateway's process, reached like a
// sandbox's agent: over a connection (an in-memory pipe).
type host struct {
	c      *agentclient.Client
	srv    *agent.Server
	served chan struct{}
}

func (h *hosts) get(id string, start agent.Starter) (*agentclient.Client, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, providers.Errorf(providers.ErrUnavailable, "the gateway is shutting down")
	}
	if x := h.byID[id]; x != nil {
		return x.c, nil
	}
	srv := agent.NewHost(start)
	a, b := net.Pipe()
	x := &host{srv: srv, served: make(chan struct{})}
	go func() {
		defer close(x.served)
		srv.Serve(a, nil)
	}()
	c, err := agentclient.Dial(context.Background(), b)
	if err != nil {
		a.Close()
		<-x.served
		return nil, err
	}
	x.c = c
	if h.byID == nil {
		h.byID = map[string]*host{}
	}
	h.byID[id] = x
	return c, nil
}

// drop ends sandbox id's host and its sessions' processes.
func (h *hosts) drop(id string) {
	h.mu.Lock()
	x := h.byID[id]
	delete(h.byID, id)
	h.mu.Unlock()
	if x != nil {
		x.end()
	}
}

func (x *host) end() {
	x.c.Close()
	<-x.served
	x.srv.Close()
}

// close ends every host.
func (h *hosts) close() {
	h.mu.Lock()
	h.closed = true
	all := h.byID
	h.byID = nil
	h.mu.Unlock()
	for _, x := range all {
		x.end()
	}
}

// OnRemove registers f to be called with the id of every sandbox the
// service removes (deleted, expired, idle), after the provider let it go.
// f must not block for long; it runs on the removing goroutine.
func (s *Service) OnRemove(f func(id string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRemove = append(s.onRemove, f)
}
