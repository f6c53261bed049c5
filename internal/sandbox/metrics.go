package sandbox

import (
	"context"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// Metrics returns sandbox id's resource use as it samples it itself (see
// providers.MetricsReader): the retained samples whose time is within
// [start, end] (a zero bound is open), oldest first, the last one taken
// now. Asking is not activity: it does not keep an idle sandbox alive.
// Any lease may ask. ErrConflict unless the sandbox is running,
// ErrUnsupported if the provider cannot tell.
func (s *Service) Metrics(ctx context.Context, c Caller, id string, start, end time.Time) ([]providers.Metrics, error) {
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return nil, providers.InvalidFields{{Field: "end", Message: "is before start"}}
	}
	mr, ok := s.p.(providers.MetricsReader)
	if !ok {
		return nil, providers.Errorf(providers.ErrUnsupported, "provider %s cannot report a sandbox's resource use", s.p.Name())
	}
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	st, why := a.box.rec.State, a.box.rec.StateReason
	s.mu.Unlock()
	if st != providers.StateRunning {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s%s", id, st, reason(why))
	}
	ms, err := mr.Metrics(ctx, id)
	if err != nil {
		return nil, err
	}
	out := ms[:0]
	for _, m := range ms {
		if (start.IsZero() || !m.Time.Before(start)) && (end.IsZero() || !m.Time.After(end)) {
			out = append(out, m)
		}
	}
	return out, nil
}
