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
	_ providers.Endpointer    = (*Local)(nil)
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
	pt, err := l.point()
	if err != nil {
		return err
	}
	if pt.SetPolicy(id, pol) || pol.None() {
		return nil
	}
	return l.attach(pt, sb, id, pol)
}

// attach plumbs sandbox id (sb, locked) into pt under pol.
func (l *Local) attach(pt *point.Point, sb *sandbox, id string, pol egress.Policy) error {
	// init's pid names the namespace; its start time tells it is still
	// that sandbox's init and not a reused pid.
	if ps, err := procfs.ReadStat("/proc", sb.st.Pid); err != nil || ps.StartTime != sb.st.StartTime {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	_, err := pt.Attach(id, fmt.Sprintf("/proc/%d/ns/net", sb.st.Pid), pol)
	return err
}

// Endpoint returns http://127.0.0.1:<port> where the egress point
// publishes port of sandbox id (the caller checked it was declared): the
// sandbox has no network but its veth, attached here with policy none if
// nothing attached it yet, so its ports are no way out. Isolation none
// has no namespace to publish from: ErrUnsupported.
func (l *Local) Endpoint(ctx context.Context, id string, port int) (providers.Endpoint, error) {
	if l.isolation != IsolationNamespaces {
		return providers.Endpoint{}, providers.Errorf(providers.ErrUnsupported, "endpoints need isolation %q", IsolationNamespaces)
	}
	sb, err := l.locked(id)
	if err != nil {
		return providers.Endpoint{}, err
	}
	defer sb.mu.Unlock()
	pt, err := l.point()
	if err != nil {
		return providers.Endpoint{}, err
	}
	if !pt.Attached(id) {
		if err := l.attach(pt, sb, id, egress.Policy{}); err != nil {
			return providers.Endpoint{}, err
		}
	}
	ap, err := pt.Publish(id, uint16(port))
	if err != nil {
		return providers.Endpoint{}, providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf("publish port %d of sandbox %s", port, id))
	}
	return providers.Endpoint{URL: "http://" + ap.String()}, nil
}

// point is the provider's egress point, made now if it was not yet.
func (l *Local) point() (*point.Point, error) {
	pt, err := l.egress.Get()
	if errors.Is(err, point.ErrClosed) {
		return nil, providers.Errorf(providers.ErrUnavailable, "the provider is closed")
	}
	return pt, err
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
	pt, err := l.point()
	if err != nil {
		return netip.Addr{}, err
	}
	if ps, err := procfs.ReadStat("/proc", sb.st.Pid); err != nil || ps.StartTime != sb.st.StartTime {
		return netip.Addr{}, providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	return pt.JoinGroup(id, fmt.Sprintf("/proc/%d/ns/net", sb.st.Pid), group)
}

// joinEarly starts joining sandbox id, whose init is pid, to group
// (JoinGroup's work, done while init starts) and returns a channel that
// gets its outcome: nil at once when there is no group or no namespace.
// Create detaches what a failed join left; JoinGroup then tries again and
// reports the failure.
func (l *Local) joinEarly(id, group string, pid int) <-chan error {
	done := make(chan error, 1)
	if group == "" || l.isolation != IsolationNamespaces {
		done <- nil
		return done
	}
	go func() {
		pt, err := l.point()
		if err == nil {
			_, err = pt.JoinGroup(id, fmt.Sprintf("/proc/%d/ns/net", pid), group)
		}
		done <- err
	}()
	return done
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
