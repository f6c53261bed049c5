package client

import (
	"context"
	"net/http"

	"github.com/sandgate/sandgate/internal/api"
)

// SetNetwork replaces a sandbox's egress policy (the client's token must
// be an owner lease). egress is "none", "all" or
// map[string][]string{"allow": …, "deny": …}; it is in effect for new
// connections when SetNetwork returns. A bad policy is an *Error with
// status 400; a provider that cannot enforce it, 409 not_supported.
func (c *Client) SetNetwork(ctx context.Context, sandboxID string, egress any) (api.SandboxInfo, error) {
	var info api.SandboxInfo
	err := c.do(ctx, http.MethodPut, c.sandboxPath(sandboxID, "network"), api.Network{Egress: egress}, &info)
	return info, err
}
