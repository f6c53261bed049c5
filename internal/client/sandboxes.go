package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/sandgate/sandgate/internal/api"
)

// Create and list authenticate with the client's token as an API key; the
// per-sandbox calls with it as a lease (an API key works there too, on the
// sandboxes it created).

// CreateSandbox makes one sandbox (req.Count must be unset: a batch is
// another answer) and returns its reference with its owner lease.
func (c *Client) CreateSandbox(ctx context.Context, req api.CreateSandbox) (api.SandboxRef, error) {
	var res api.SandboxRef
	if req.Count != nil {
		return res, fmt.Errorf("client: CreateSandbox makes one sandbox; count is for a batch")
	}
	err := c.doKey(ctx, http.MethodPost, "/v1/sandboxes", req, &res)
	return res, err
}

// Sandboxes lists the key's sandboxes; status and label ("k=v") filter
// when not empty.
func (c *Client) Sandboxes(ctx context.Context, status, label string) ([]api.SandboxInfo, error) {
	q := url.Values{}
	if status != "" {
		q.Set("status", status)
	}
	if label != "" {
		q.Set("label", label)
	}
	path := "/v1/sandboxes"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var res api.SandboxList
	err := c.doKey(ctx, http.MethodGet, path, nil, &res)
	return res.Sandboxes, err
}

// Sandbox describes one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (api.SandboxInfo, error) {
	var res api.SandboxInfo
	err := c.do(ctx, http.MethodGet, c.sandboxPath(id), nil, &res)
	return res, err
}

// DeleteSandbox deletes a sandbox (owner); one already gone is not an
// error to the gateway (deleted false).
func (c *Client) DeleteSandbox(ctx context.Context, id string) (api.DeleteResult, error) {
	var res api.DeleteResult
	err := c.do(ctx, http.MethodDelete, c.sandboxPath(id), nil, &res)
	return res, err
}

// RenewSandbox extends a sandbox's lifetime: ttlS seconds from now, or its
// own TTL again when ttlS is nil.
func (c *Client) RenewSandbox(ctx context.Context, id string, ttlS *float64) (api.SandboxInfo, error) {
	var res api.SandboxInfo
	err := c.do(ctx, http.MethodPost, c.sandboxPath(id, "renew"), api.RenewRequest{TTLS: ttlS}, &res)
	return res, err
}

// Snapshot captures a sandbox's filesystem (owner).
func (c *Client) Snapshot(ctx context.Context, id string, req api.SnapshotRequest) (api.Snapshot, error) {
	var res api.Snapshot
	err := c.do(ctx, http.MethodPost, c.sandboxPath(id, "snapshots"), req, &res)
	return res, err
}

// Snapshots lists the key's snapshots, oldest first.
func (c *Client) Snapshots(ctx context.Context) ([]api.Snapshot, error) {
	var res api.SnapshotList
	err := c.doKey(ctx, http.MethodGet, "/v1/snapshots", nil, &res)
	return res.Snapshots, err
}

// DeleteSnapshot deletes the key's snapshot sid (idempotent: one already
// gone answers deleted false).
func (c *Client) DeleteSnapshot(ctx context.Context, sid string) (api.DeleteResult, error) {
	var res api.DeleteResult
	err := c.doKey(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(sid), nil, &res)
	return res, err
}

// Fork snapshots a sandbox and makes count sandboxes of it, all or none.
func (c *Client) Fork(ctx context.Context, id string, count int) ([]api.SandboxRef, error) {
	var res api.ForkResult
	err := c.do(ctx, http.MethodPost, c.sandboxPath(id, "fork"), api.ForkRequest{Count: &count}, &res)
	return res.Sandboxes, err
}

// MintLease mints a lease of the sandbox, a child of the calling one.
func (c *Client) MintLease(ctx context.Context, id string, req api.LeaseRequest) (api.SandboxRef, error) {
	var res api.SandboxRef
	err := c.do(ctx, http.MethodPost, c.sandboxPath(id, "leases"), req, &res)
	return res, err
}

// ReleaseLease revokes the client's own lease and every lease minted from
// it.
func (c *Client) ReleaseLease(ctx context.Context, id string) (api.ReleaseResult, error) {
	var res api.ReleaseResult
	err := c.do(ctx, http.MethodDelete, c.sandboxPath(id, "leases", "release"), nil, &res)
	return res, err
}

// Leases lists a sandbox's live leases (owner).
func (c *Client) Leases(ctx context.Context, id string) ([]api.LeaseInfo, error) {
	var res api.LeaseList
	err := c.do(ctx, http.MethodGet, c.sandboxPath(id, "leases"), nil, &res)
	return res.Leases, err
}

// RevokeLease ends lease leaseID of the sandbox and its subtree (owner).
func (c *Client) RevokeLease(ctx context.Context, id, leaseID string) (api.RevokeResult, error) {
	var res api.RevokeResult
	err := c.do(ctx, http.MethodDelete, c.sandboxPath(id, "leases", leaseID), nil, &res)
	return res, err
}

// PutFile streams body into the file at path (PUT …/files), replacing it.
func (c *Client) PutFile(ctx context.Context, id, path string, body io.Reader) (api.FileWritten, error) {
	var res api.FileWritten
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.fileURL(id, path), body)
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	err = c.roundTrip(req, &res)
	return res, err
}

// GetFile opens the file at path for streaming (GET …/files); the caller
// closes it. size is its length in bytes (-1 when the gateway did not say).
func (c *Client) GetFile(ctx context.Context, id, path string) (body io.ReadCloser, size int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.fileURL(id, path), nil)
	if err != nil {
		return nil, 0, err
	}
	c.authorize(req, "X-Sandbox-Lease", c.token)
	res, err := c.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	if res.StatusCode/100 != 2 {
		defer res.Body.Close()
		return nil, 0, problem(res)
	}
	size = -1
	if n, err := strconv.ParseInt(res.Header.Get("Content-Length"), 10, 64); err == nil {
		size = n
	}
	return res.Body, size, nil
}

func (c *Client) fileURL(id, path string) string {
	return c.base + c.sandboxPath(id, "files") + "?path=" + url.QueryEscape(path)
}
