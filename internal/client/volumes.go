package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandgate/sandgate/internal/api"
)

// The volume calls authenticate with the client's token as an API key
// (a volume is the key's, not a sandbox's).

// CreateVolume makes a volume of the key (POST /v1/volumes).
func (c *Client) CreateVolume(ctx context.Context, req api.CreateVolume) (api.Volume, error) {
	var res api.Volume
	err := c.doKey(ctx, http.MethodPost, "/v1/volumes", req, &res)
	return res, err
}

// Volumes lists the key's volumes, oldest first.
func (c *Client) Volumes(ctx context.Context) ([]api.Volume, error) {
	var res api.VolumeList
	err := c.doKey(ctx, http.MethodGet, "/v1/volumes", nil, &res)
	return res.Volumes, err
}

// Volume describes the key's volume ref (a name or an id).
func (c *Client) Volume(ctx context.Context, ref string) (api.Volume, error) {
	var res api.Volume
	err := c.doKey(ctx, http.MethodGet, "/v1/volumes/"+url.PathEscape(ref), nil, &res)
	return res, err
}

// DeleteVolume deletes the key's volume ref and its storage; a volume a
// sandbox mounts is refused (an *Error of status 409).
func (c *Client) DeleteVolume(ctx context.Context, ref string) error {
	var res api.DeleteResult
	return c.doKey(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(ref), nil, &res)
}
