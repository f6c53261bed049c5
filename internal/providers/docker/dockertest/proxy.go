package dockertest

import (
	"os"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/testkit"
)

// Proxy is a testkit.Proxy in front of the real daemon socket. Giving a
// provider (or a gateway, --docker-host) Host() instead of the daemon's
// address lets a test take the daemon away from that one user: Cut closes
// every connection and refuses new ones, Restore accepts again. Other
// users of the shared daemon notice nothing.
type Proxy struct{ *testkit.Proxy }

// NewProxy starts a proxy to the default daemon socket (DOCKER_HOST when
// it is a unix socket, else /var/run/docker.sock). It is cut when t ends.
// It does not check that a daemon answers: call Require for that.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	target := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		target = strings.TrimPrefix(h, "unix://")
	}
	return &Proxy{testkit.NewProxy(t, "unix", target)}
}

// Host is the proxy's address for client.WithHost or --docker-host.
func (p *Proxy) Host() string { return "unix://" + p.Addr() }
