package docker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/providers"
)

// Egress policies and groups go through the egress point (package point)
// the provider owns, made on first use: a sandbox with a policy other than
// none, or in a group, gets a veth from the point's router namespace into
// its container's network namespace as eth0, with an address of the
// point's pool and a default route through it. Only a sandbox with network
// "none" can be attached: one with a network of its own or an operator's
// network already has a way out the point cannot close (the bridge routes
// anywhere but the host and other sandbox networks, and a root holding
// NET_ADMIN could put its default route back on it), so a policy other
// than none or a group is refused for it (ErrUnsupported).
//
// Ports do not need a network: a sandbox whose create declares ports and
// gives a policy (none included) or a group is made with network none
// (routedPorts), and Endpoint publishes each port through the point
// (point.Publish: a listener on 127.0.0.1 dialling the sandbox's address
// from the router), attaching the sandbox first if nothing has yet.

var (
	_ providers.Egresser      = (*Docker)(nil)
	_ providers.EgressCounter = (*Docker)(nil)
	_ providers.Grouper       = (*Docker)(nil)
)

// SetEgress gives sandbox id the policy pol. The first policy other than
// none attaches its container's network namespace (where it has only lo)
// to the egress point. ErrUnsupported when the daemon is not on this host
// or the sandbox has a network; ErrConflict when it is not running.
func (d *Docker) SetEgress(ctx context.Context, id string, pol egress.Policy) error {
	d.egressMu.Lock()
	defer d.egressMu.Unlock()
	if err := d.canAttach(); err != nil {
		if pol.None() {
			return nil // none is what such a sandbox has
		}
		return err
	}
	pt, err := d.point()
	if err != nil {
		return err
	}
	if pt.SetPolicy(id, pol) || pol.None() {
		return nil
	}
	_, err = d.attach(ctx, pt, id, pol)
	return err
}

// JoinGroup attaches sandbox id to the egress point (with policy none if
// it has no other yet) and puts it in group there; it returns the address
// the other members reach it at (its end of its veth).
func (d *Docker) JoinGroup(ctx context.Context, id, group string) (netip.Addr, error) {
	d.egressMu.Lock()
	defer d.egressMu.Unlock()
	if err := d.canAttach(); err != nil {
		return netip.Addr{}, err
	}
	pt, err := d.point()
	if err != nil {
		return netip.Addr{}, err
	}
	addr, ok := pt.Address(id) // attached by SetEgress: its policy stays
	if !ok {
		if addr, err = d.attach(ctx, pt, id, egress.Policy{}); err != nil {
			return netip.Addr{}, err
		}
	}
	// Attached: the point forwards between the group's members from now.
	if _, err := pt.JoinGroup(id, "", group); err != nil {
		return netip.Addr{}, err
	}
	return addr, nil
}

// EgressStats are sandbox id's connection counts through the egress point.
func (d *Docker) EgressStats(id string) egress.Stats {
	if pt := d.egress.Made(); pt != nil {
		return pt.Stats(id)
	}
	return egress.Stats{}
}

// detachEgress removes id's way out, if it had one, and frees its slot.
func (d *Docker) detachEgress(id string) {
	d.egressMu.Lock()
	defer d.egressMu.Unlock()
	if pt := d.egress.Made(); pt != nil {
		pt.Detach(id)
	}
}

// canAttach says why this provider cannot attach sandboxes: the network
// namespaces of a daemon's containers are reachable only on its host.
func (d *Docker) canAttach() error {
	if h := d.cli.DaemonHost(); !strings.HasPrefix(h, "unix://") {
		return providers.Errorf(providers.ErrUnsupported, "egress policies and groups need the docker daemon on the gateway's host; it is at %s", h)
	}
	return nil
}

func (d *Docker) point() (*point.Point, error) {
	pt, err := d.egress.Get()
	if errors.Is(err, point.ErrClosed) {
		return nil, providers.Errorf(providers.ErrUnavailable, "the provider is closed")
	}
	return pt, err
}

// attach plumbs sandbox id's container into pt under pol and returns the
// sandbox's address. The namespace is opened from the container's init
// pid, which the daemon reports; the container is inspected again once it
// is open, and only if it still runs with that pid (so the pid was not
// reused by another process meanwhile) is the open namespace attached.
// Nothing inside the container is followed: /proc/PID/ns/net is the
// kernel's.
func (d *Docker) attach(ctx context.Context, pt *point.Point, id string, pol egress.Policy) (netip.Addr, error) {
	pid, err := d.initPid(ctx, id)
	if err != nil {
		return netip.Addr{}, err
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return netip.Addr{}, providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	defer f.Close()
	if d.afterNetnsOpen != nil {
		d.afterNetnsOpen(id) // tests: the container restarts here
	}
	again, err := d.initPid(ctx, id)
	if err != nil {
		return netip.Addr{}, err
	}
	if again != pid {
		return netip.Addr{}, providers.Errorf(providers.ErrConflict, "sandbox %s restarted while its network was being attached", id)
	}
	// A container of network none has a namespace of its own; never
	// plumb the gateway's.
	var own, sb unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &sb); err != nil {
		return netip.Addr{}, err
	}
	if err := unix.Stat("/proc/self/ns/net", &own); err != nil {
		return netip.Addr{}, err
	}
	if own.Dev == sb.Dev && own.Ino == sb.Ino {
		return netip.Addr{}, providers.Errorf(providers.ErrUnsupported, "sandbox %s shares the gateway's network namespace", id)
	}
	rAddr, err := pt.Attach(id, fmt.Sprintf("/proc/self/fd/%d", f.Fd()), pol)
	if err != nil {
		return netip.Addr{}, providers.Wrap(providers.ErrUnavailable, err, "attach sandbox "+id+" to the egress point")
	}
	return rAddr.Next(), nil
}

// routedPorts reports whether a create's ports go through the egress
// point: it declares ports, names no operator's network, and gives an
// egress policy (none included) or a group, which a network of its own
// would get around.
func routedPorts(spec providers.CreateSpec, o createOptions) bool {
	return len(spec.Ports) > 0 && o.network == "" && (spec.Egress != nil || spec.Group != "")
}

// routedEndpoint is the endpoint of port of a routed sandbox (network
// none, the port exposed): the point's listener for it. A sandbox nothing
// attached yet (a policy of none, or a gateway restart before its policy
// is restored) is attached with policy none, which SetEgress replaces.
func (d *Docker) routedEndpoint(ctx context.Context, id string, port int) (providers.Endpoint, error) {
	d.egressMu.Lock()
	defer d.egressMu.Unlock()
	if err := d.canAttach(); err != nil {
		return providers.Endpoint{}, err
	}
	pt, err := d.point()
	if err != nil {
		return providers.Endpoint{}, err
	}
	if !pt.Attached(id) {
		if _, err := d.attach(ctx, pt, id, egress.Policy{}); err != nil {
			return providers.Endpoint{}, err
		}
	}
	ap, err := pt.Publish(id, uint16(port))
	if err != nil {
		return providers.Endpoint{}, providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf("publish port %d of sandbox %s", port, id))
	}
	return providers.Endpoint{URL: "http://" + ap.String()}, nil
}

// initPid is the host pid of running sandbox id's init. ErrUnsupported
// if the sandbox has a network (see the top of this file), ErrConflict if
// it is not running.
func (d *Docker) initPid(ctx context.Context, id string) (int, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return 0, d.kind(err, "sandbox %s", id)
	}
	if info.Config == nil || info.Config.Labels[LabelSandbox] != id || info.Config.Labels[LabelInstance] != d.instance {
		return 0, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	if info.HostConfig == nil || info.HostConfig.NetworkMode != "none" {
		return 0, providers.Errorf(providers.ErrUnsupported,
			"egress policies and groups need a sandbox without a network of its own; sandbox %s has one "+
				"(provider_options.network, or ports declared by a create that gave neither network.egress nor group)", id)
	}
	if info.State == nil || !info.State.Running || info.State.Pid <= 0 {
		return 0, providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	return info.State.Pid, nil
}
