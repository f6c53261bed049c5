package sandbox

import (
	"context"
	"fmt"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
)

// checkEgress refuses a policy the provider cannot enforce.
func (s *Service) checkEgress(pol *egress.Policy) error {
	if pol == nil || pol.None() {
		return nil
	}
	if _, ok := s.p.(providers.Egresser); !ok {
		return providers.Errorf(providers.ErrUnsupported, "egress policies other than none are not supported by provider %s", s.p.Name())
	}
	if c, ok := s.p.(providers.EgressChecker); ok {
		return c.CheckEgress(*pol)
	}
	return nil
}

// SetNetwork replaces a sandbox's egress policy (owner scope): effective
// for new connections when it returns, and kept in its record.
func (s *Service) SetNetwork(ctx context.Context, c Caller, id string, pol egress.Policy) (Info, error) {
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return Info{}, err
	}
	e, ok := s.p.(providers.Egresser)
	if !ok {
		// None on a provider without policies is what it already has.
		if pol.None() {
			s.mu.Lock()
			defer s.mu.Unlock()
			return a.box.info(), nil
		}
		return Info{}, s.checkEgress(&pol)
	}
	s.mu.Lock()
	state, rec := a.box.rec.State, a.box.rec
	s.mu.Unlock()
	if state != providers.StateRunning && state != providers.StatePaused {
		return Info{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, state)
	}
	if err := e.SetEgress(ctx, id, pol); err != nil {
		return Info{}, fmt.Errorf("egress policy of %s: %w", id, err)
	}
	rec.Egress = &pol
	if err := s.st.PutRecord(ctx, rec, nil); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a.box.rec.Egress = &pol
	return a.box.info(), nil
}

// restoreEgress gives the live sandboxes found at start their policies
// back: a gateway restart loses the egress point (its namespace went with
// the old process), so each is plumbed anew. A failure is logged: that
// sandbox has no way out until its policy is set again.
func (s *Service) restoreEgress(ctx context.Context) {
	e, ok := s.p.(providers.Egresser)
	if !ok {
		return
	}
	for id, b := range s.boxes {
		if pol := b.rec.Egress; pol != nil && !pol.None() && b.rec.State.Live() {
			if err := e.SetEgress(ctx, id, *pol); err != nil {
				s.log.Warn("restore egress policy", "sandbox", id, "err", err)
			}
		}
	}
}
