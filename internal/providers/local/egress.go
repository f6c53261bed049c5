package local

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
)

var (
	_ providers.Egresser      = (*Local)(nil)
	_ providers.EgressCounter = (*Local)(nil)
	_ providers.Grouper       = (*Local)(nil)
)

// SetEgress gives sandbox id the policy pol. The first policy other than
// none attaches its network namespace (where it has only lo) to the egress
// point: eth0 with an address of the pool and a default route through the
// point. Isolation none has no namespace to attach: ErrUnsupported.
func (l *Local) SetEgress(ctx context.Context, id string, pol egress.Policy) error {
	if l.isolation != IsolationNamespaces {
		return providers.Errorf(providers.ErrUnsupported, "egress policies need isolation %q", IsolationNamespaces)
	}
	sb, err := l.locked(id)
	if err != nil {
		return err
	}
	defer sb.mu.Unlock()
	pt, err := l.egress.Get()
	if errors.Is(err, point.ErrClosed) {
		return providers.Errorf(providers.ErrUnavailable, "the provider is closed")
	}
	if err != nil {
		return err
	}
	if pt.SetPolicy(id, pol) || pol.None() {
		return nil
	}
	// init's pid names the namespace; its start time tells it is still
	// that sandbox's init and not a reused pid.
	if ps, err := procfs.ReadStat("/proc", sb.st.Pid); err != nil || ps.StartTime != sb.st.StartTime {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	if _, err := pt.Attach(id, fmt.Sprintf("/proc/%d/ns/net", sb.st.Pid), pol); err != nil {
		return err
	}
	return nil
}

// JoinGroup connects sandbox id to group through the egress point (it is
// attached with policy none if it had no policy yet): the point forwards
// between the members of one group only. It returns id's address there.
// Isolation none has no namespace to connect: ErrUnsupported.
func (l *Local) JoinGroup(ctx context.Context, id, group string) (netip.Addr, error) {
	if l.isolation != IsolationNamespaces {
		return netip.Addr{}, providers.Errorf(providers.ErrUnsupported, "sandbox groups need isolation %q", IsolationNamespaces)
	}
	sb, err := l.locked(id)
	if err != nil {
		return netip.Addr{}, err
	}
	defer sb.mu.Unlock()
	pt, err := l.egress.Get()
	if err != nil {
		return netip.Addr{}, err
	}
	if ps, err := procfs.ReadStat("/proc", sb.st.Pid); err != nil || ps.StartTime != sb.st.StartTime {
		return netip.Addr{}, providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	return pt.JoinGroup(id, fmt.Sprintf("/proc/%d/ns/net", sb.st.Pid), group)
}

// EgressStats are sandbox id's connection counts through the egress point.
func (l *Local) EgressStats(id string) egress.Stats {
	if pt := l.egress.Made(); pt != nil {
		return pt.Stats(id)
	}
	return egress.Stats{}
}

// detachEgress removes id's way out, if it had one.
func (l *Local) detachEgress(id string) {
	if pt := l.egress.Made(); pt != nil {
		pt.Detach(id)
	}
}
