package sandbox

import (
	"context"

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
// and returns the connection to the sandbox's agent, where its terminal
// sessions live (they outlive the gateway). ErrUnsupported when the
// provider runs no agent.
func (s *Service) SessionHost(ctx context.Context, c Caller, id string) (*agentclient.Client, error) {
	ag, _, end, err := s.agentHost(ctx, c, id, "terminal sessions", nil)
	if err != nil {
		return nil, err
	}
	end()
	return ag, nil
}

// OnRemove registers f to be called with the id of every sandbox the
// service removes (deleted, expired, idle), after the provider let it go.
// f must not block for long; it runs on the removing goroutine.
func (s *Service) OnRemove(f func(id string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRemove = append(s.onRemove, f)
}
