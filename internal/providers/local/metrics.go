package local

import (
	"context"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

var _ providers.MetricsReader = (*Local)(nil)

// Metrics returns sandbox id's resource use as its init samples it: its
// cgroups (opened before its root stopped being the host's) and statfs
// of its root. ErrConflict unless the sandbox is running.
func (l *Local) Metrics(ctx context.Context, id string) ([]providers.Metrics, error) {
	sb, err := l.running(id)
	if err != nil {
		return nil, err
	}
	var ms []providers.Metrics
	err = sb.call(ctx, func(c *agentclient.Client) (err error) {
		ms, err = c.Metrics(ctx)
		return err
	})
	return ms, err
}
