package agentclient

import (
	"context"
	"fmt"
	"io"

	"github.com/sandgate/sandgate/internal/providers"
)

// Via is the data plane of a provider whose sandboxes are reached through
// Links: commands and files go to the sandbox's agent, and a
// connection that broke is mapped by Links.Gone. A provider embeds it.
type Via struct {
	// Connect returns the connection to sandbox id's agent (the
	// provider's Agent: Links.Get, after its own checks).
	Connect func(ctx context.Context, id string) (*Client, error)
	Links   *Links
}

// Exec runs req.Command through the sandbox's agent, which kills the
// command's whole tree at the timeout, on cancel, and (unless background
// processes are preserved) when it returns. Errors: ErrNotFound (no such
// sandbox), ErrConflict (paused, stopped, or its agent gone), ErrInvalid
// (unknown user, missing cwd, no shell), ErrUnavailable (backend or agent
// unreachable); ctx's error when ctx ends (the tree is killed first).
func (v Via) Exec(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	req, err := req.Check()
	if err != nil {
		return providers.ExecResult{}, err
	}
	c, err := v.Connect(ctx, id)
	if err != nil {
		return providers.ExecResult{}, err
	}
	res, err := c.Exec(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", id, ctx.Err())
		}
		return providers.ExecResult{}, v.Links.Gone(ctx, id, err)
	}
	return res, nil
}

// ReadFile opens the regular file at p through the sandbox's agent.
func (v Via) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	r, n, err := c.ReadFile(ctx, p)
	if err != nil {
		return nil, 0, v.Links.Gone(ctx, id, err)
	}
	return r, n, nil
}

// WriteFile streams r into the file at p through the sandbox's agent,
// creating parent directories.
func (v Via) WriteFile(ctx context.Context, id, p string, r io.Reader) (int64, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return 0, err
	}
	n, err := c.WriteFile(ctx, p, r)
	if err != nil {
		return 0, v.Links.Gone(ctx, id, err)
	}
	return n, nil
}

// StatFile describes the file at p through the sandbox's agent.
func (v Via) StatFile(ctx context.Context, id, p string) (providers.FileInfo, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return providers.FileInfo{}, err
	}
	fi, err := c.StatFile(ctx, p)
	if err != nil {
		return providers.FileInfo{}, v.Links.Gone(ctx, id, err)
	}
	return fi, nil
}

// ListDir lists the directory at p through the sandbox's agent.
func (v Via) ListDir(ctx context.Context, id, p string) ([]providers.FileInfo, bool, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return nil, false, err
	}
	entries, truncated, err := c.ListDir(ctx, p)
	if err != nil {
		return nil, false, v.Links.Gone(ctx, id, err)
	}
	return entries, truncated, nil
}
