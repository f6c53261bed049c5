package providers

import (
	"context"

	"github.com/sandgate/sandgate/internal/egress"
)

// Egresser is implemented by providers that enforce egress policies
// (package egress). Without it, a sandbox has the provider's own network
// and any policy but none is ErrUnsupported.
type Egresser interface {
	// SetEgress makes pol sandbox id's policy, effective for connections
	// and DNS questions from its return (open connections stay). The first
	// policy other than none gives the sandbox its way out; a later none
	// leaves the way but lets nothing through it. It is also how the
	// service restores policies after a gateway restart.
	SetEgress(ctx context.Context, id string, pol egress.Policy) error
}

// EgressCounter is implemented by Egressers that count connections per
// sandbox (allowed and denied since the policy was first applied by this
// gateway process).
type EgressCounter interface {
	EgressStats(id string) egress.Stats
}
