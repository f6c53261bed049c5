package sandbox

import (
	"context"
	"fmt"

	"github.com/sandgate/sandgate/internal/providers"
)

// Access checks that c may operate sandbox id: nil, or the 401/403/404
// error of the check. For routes (WebSocket attach) that act on state the
// service does not hold.
func (s *Service) Access(c Caller, id string) error {
	_, err := s.authorize(c, id, ScopeOperate)
	return err
}

// StartProcess starts a long-lived process (a terminal session) in the
// sandbox. The sandbox must be running and the provider able to.
func (s *Service) StartProcess(ctx context.Context, c Caller, id string, spec providers.ProcessSpec) (providers.Process, error) {
	if spec.Cwd != "" {
		if err := checkPath(spec.Cwd); err != nil {
			return nil, providers.InvalidFields{{Field: "cwd", Message: err.Error()}}
		}
	}
	a, err := s.authorize(c, id, ScopeOperate)
	if err != nil {
		return nil, err
	}
	ps, ok := s.p.(providers.ProcessStarter)
	if !ok {
		return nil, providers.Errorf(providers.ErrUnsupported, "terminal sessions are not supported by provider %s", s.p.Name())
	}
	end, err := s.begin(a.box)
	if err != nil {
		return nil, err
	}
	defer end()
	if spec.Cwd == "" {
		spec.Cwd = a.box.rec.Workdir
	} else {
		spec.Cwd = resolve(a.box.rec.Workdir, spec.Cwd)
	}
	p, err := ps.StartProcess(ctx, id, spec)
	if err != nil {
		return nil, fmt.Errorf("start process in %s: %w", id, err)
	}
	return p, nil
}

// OnRemove registers f to be called with the id of every sandbox the
// service removes (deleted, expired, idle), after the provider let it go.
// f must not block for long; it runs on the removing goroutine.
func (s *Service) OnRemove(f func(id string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onRemove = append(s.onRemove, f)
}
