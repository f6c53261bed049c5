package main

import (
	"flag"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sandgate/sandgate/internal/egress/point"
)

// egressFlags configure the egress point of the local and docker
// providers (Resolve also the kubernetes pods' points).
type egressFlags struct {
	Resolve map[string][]netip.Addr
	Netns   string
}

func (e *egressFlags) define(fs *flag.FlagSet) {
	fs.Func("egress-resolve", "local, docker, kubernetes with --k8s-egress-sidecar: static DNS answers of the egress point, used before the host's (pods': the cluster's) resolver: name=addr,... (a name may repeat; tests, air-gapped deployments)", func(v string) error {
		// The command line replaces the environment's.
		r, err := point.ParseResolve(v)
		e.Resolve = r
		return err
	})
	fs.StringVar(&e.Netns, "egress-netns", "", "local, docker: network namespace file (e.g. /proc/PID/ns/net) from which the egress point dials admitted connections (default: the gateway's own)")
}

func (e egressFlags) options(log *slog.Logger, reg prometheus.Registerer) point.Options {
	return point.Options{Resolve: e.Resolve, EgressNetns: e.Netns, Logger: log.With("component", "egress"), Registerer: reg}
}
