package docker

import (
	"context"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/hostfw"
)

// A sandbox that declares ports, and whose create gives neither an egress
// policy nor a group, gets a network of its own (createNetwork): a bridge
// named with the firewall's prefix, so the gateway's rules (package
// hostfw) drop everything it starts towards the host or another sandbox
// network, with inter-container traffic off. Other sandboxes have no
// network at all ("none"); the egress point publishes the ports of those
// that declare them (egress.go).

// networkName is the name of sandbox id's own network.
func networkName(id string) string { return "sandgate-" + id }

// openFirewall installs the host rules unless the daemon is not on this
// host (rules here would guard nothing). The error says why sandboxes
// with ports cannot be isolated.
func openFirewall(daemonHost string, cfg hostfw.Config) (*hostfw.Firewall, error) {
	if !strings.HasPrefix(daemonHost, "unix://") {
		return nil, providers.Errorf(providers.ErrUnavailable, "the docker daemon at %s is not on this host, so the gateway cannot firewall its networks", daemonHost)
	}
	return hostfw.Open(cfg)
}

// checkIsolation adds to bad why a sandbox with a network of its own
// cannot be created: it needs the firewall unless
// Options.UnisolatedNetworks.
func (d *Docker) checkIsolation(bad *providers.InvalidFields) {
	if d.fw == nil && !d.opts.UnisolatedNetworks {
		bad.Add("ports", "this gateway cannot isolate sandbox networks (its start-up log says why), so it publishes no ports; "+
			"the operator may allow ports without isolation (--docker-unisolated-networks)")
	}
}

// createNetwork makes sandbox id's own network and returns its docker id.
func (d *Docker) createNetwork(ctx context.Context, id string) (string, error) {
	resp, err := d.cli.NetworkCreate(ctx, networkName(id), network.CreateOptions{
		Driver: "bridge",
		Labels: map[string]string{LabelSandbox: id, LabelInstance: d.instance},
		Options: map[string]string{
			"com.docker.network.bridge.name":       d.fwConfig.BridgeName(d.instance + "/" + id),
			"com.docker.network.bridge.enable_icc": "false",
		},
	})
	if err != nil && strings.Contains(err.Error(), "non-overlapping IPv4 address pool") {
		// The daemon's default pools hold about 30 networks; an operator
		// running more sandboxes with ports gives it a larger pool
		// (daemon.json default-address-pools).
		return "", providers.Wrap(providers.ErrUnavailable, err, "the docker daemon has no address pool left for another sandbox network (too many sandboxes with ports; its default-address-pools set how many)")
	}
	if err != nil {
		return "", d.kind(err, "create the network of sandbox %s", id)
	}
	return resp.ID, nil
}

// removeNetwork removes sandbox id's own network, if it has one, and
// reports whether it did. Its container must be gone.
func (d *Docker) removeNetwork(ctx context.Context, id string) (bool, error) {
	nets, err := d.cli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", LabelInstance+"="+d.instance), filters.Arg("label", LabelSandbox+"="+id))})
	if err != nil {
		return false, d.kind(err, "delete the network of sandbox %s", id)
	}
	removed := false
	for _, n := range nets {
		if err := d.cli.NetworkRemove(ctx, n.ID); err != nil && !cerrdefs.IsNotFound(err) {
			return removed, d.kind(err, "delete the network of sandbox %s", id)
		}
		removed = true
	}
	return removed, nil
}

// removeNetworkAfterFailure removes network netID that a failed create of
// sandbox id made, even when ctx is done.
func (d *Docker) removeNetworkAfterFailure(ctx context.Context, id, netID string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := d.cli.NetworkRemove(rctx, netID); err != nil && !cerrdefs.IsNotFound(err) {
		d.log.Error("removing the network of a half-made sandbox", "sandbox", id, "err", err)
	}
}

// networkSandboxes lists the sandboxes of this instance that have a
// network of their own.
func (d *Docker) networkSandboxes(ctx context.Context) ([]string, error) {
	nets, err := d.cli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(
		filters.Arg("label", LabelInstance+"="+d.instance), filters.Arg("label", LabelSandbox))})
	if err != nil {
		return nil, d.kind(err, "list sandbox networks")
	}
	ids := make([]string, 0, len(nets))
	for _, n := range nets {
		if id := n.Labels[LabelSandbox]; id != "" {
			ids = append(ids, id)
		}
	}
	return ids, nil
}
