package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sandgate/sandgate/internal/egress/point"
)

// egressFlags configure the egress point of the local and docker
// providers.
type egressFlags struct {
	Resolve map[string][]netip.Addr
	Netns   string
}

func (e *egressFlags) define(fs *flag.FlagSet) {
	fs.Func("egress-resolve", "local, docker: static DNS answers of the egress point, used before the host's resolver: name=addr,... (a name may repeat; tests, air-gapped deployments)", func(v string) error {
		e.Resolve = map[string][]netip.Addr{} // the command line replaces the environment's
		for _, kv := range strings.Split(v, ",") {
			if kv = strings.TrimSpace(kv); kv == "" {
				continue
			}
			name, addr, ok := strings.Cut(kv, "=")
			a, err := netip.ParseAddr(strings.TrimSpace(addr))
			if !ok || err != nil {
				return fmt.Errorf("%q: want name=address", kv)
			}
			name = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
			e.Resolve[name] = append(e.Resolve[name], a)
		}
		return nil
	})
	fs.StringVar(&e.Netns, "egress-netns", "", "local, docker: network namespace file (e.g. /proc/PID/ns/net) from which the egress point dials admitted connections (default: the gateway's own)")
}

func (e egressFlags) options(log *slog.Logger, reg prometheus.Registerer) point.Options {
	return point.Options{Resolve: e.Resolve, EgressNetns: e.Netns, Logger: log.With("component", "egress"), Registerer: reg}
}
