package egress

import (
	"net/netip"
	"slices"
)

// Reserved are the destinations no policy reaches (loopback, link-local,
// multicast, ...), for enforcers outside package egress/point that must
// exclude them the same way (the kubernetes provider's NetworkPolicies).
func Reserved() []netip.Prefix { return slices.Clone(reserved) }
