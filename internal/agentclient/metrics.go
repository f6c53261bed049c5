package agentclient

import (
	"context"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// Metrics returns the sandbox's resource use as its agent samples it
// (see providers.MetricsReader). The agent is not trusted: a reply over
// agentwire.MaxReply, or samples that providers.CheckMetrics refuses,
// are a violation (ErrViolation). An agent that predates the op answers
// ErrUnsupported.
func (c *Client) Metrics(ctx context.Context) ([]providers.Metrics, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpMetrics})
	if providers.Kind(err) == providers.ErrUnsupported {
		return nil, providers.Wrap(providers.ErrUnsupported, err, "this sandbox's agent is of an older build, which cannot report metrics (a sandbox created by this release can)")
	}
	if err != nil {
		return nil, err
	}
	if err := providers.CheckMetrics(rep.Metrics); err != nil {
		return nil, c.violate(&agentwire.ProtocolError{What: err.Error()})
	}
	return rep.Metrics, nil
}

// Metrics returns sandbox id's resource use through its agent.
func (v Via) Metrics(ctx context.Context, id string) ([]providers.Metrics, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return nil, err
	}
	ms, err := c.Metrics(ctx)
	if err != nil {
		return nil, v.Links.Gone(ctx, id, err)
	}
	return ms, nil
}
