package providers

import (
	"context"
	"net/netip"

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

// Grouper is implemented by providers that connect the sandboxes of a
// group: members reach each other at their addresses on every port and
// protocol, and no one else reaches them (other groups, other keys,
// ungrouped sandboxes, the host). Without it, a create with a group is
// ErrUnsupported.
type Grouper interface {
	// JoinGroup connects sandbox id to group, an opaque id the service
	// derives from the API key and the group's name (one sandbox joins
	// one group, once). It returns the address the other members reach id
	// at. It is also how the service restores membership after a gateway
	// restart (the address may change then). Delete leaves the group.
	JoinGroup(ctx context.Context, id, group string) (netip.Addr, error)
}

// EgressChecker is implemented by Egressers that cannot enforce every
// policy (kubernetes without its pods' egress points: no domain rules):
// CheckEgress refuses, before a create makes anything, a policy SetEgress
// would refuse.
type EgressChecker interface {
	CheckEgress(pol egress.Policy) error
}
