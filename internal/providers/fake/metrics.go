package fake

import (
	"context"

	"github.com/sandgate/sandgate/internal/providers"
)

var _ providers.MetricsReader = (*Provider)(nil)

// Metrics returns what sandbox id's agent samples (see Agent): the
// figures of the test process's own cgroup.
func (p *Provider) Metrics(ctx context.Context, id string) ([]providers.Metrics, error) {
	c, err := p.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	return c.Metrics(ctx)
}
