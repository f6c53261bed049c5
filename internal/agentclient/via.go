package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

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

// ReadFile opens the regular file at p through the sandbox's agent. Over
// a direct connection (WithDirect) the agent passes the file itself and
// the caller reads it; otherwise its bytes stream over the connection.
func (v Via) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	f, err := c.Open(ctx, p, false)
	switch {
	case err == nil:
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, fi.Size(), nil
	case providers.Kind(err) != providers.ErrUnsupported:
		return nil, 0, v.Links.Gone(ctx, id, err)
	}
	r, n, err := c.ReadFile(ctx, p)
	if err != nil {
		return nil, 0, v.Links.Gone(ctx, id, err)
	}
	return r, n, nil
}

// WriteFile streams r into the file at p through the sandbox's agent,
// creating parent directories: into the file itself over a direct
// connection (see ReadFile).
func (v Via) WriteFile(ctx context.Context, id, p string, r io.Reader) (int64, error) {
	c, err := v.Connect(ctx, id)
	if err != nil {
		return 0, err
	}
	f, err := c.Open(ctx, p, true)
	switch {
	case err == nil:
		return writeFile(ctx, f, r)
	case providers.Kind(err) != providers.ErrUnsupported:
		return 0, v.Links.Gone(ctx, id, err)
	}
	n, err := c.WriteFile(ctx, p, r)
	if err != nil {
		return 0, v.Links.Gone(ctx, id, err)
	}
	return n, nil
}

// writeFile copies r into f, which it closes.
func writeFile(ctx context.Context, f *os.File, r io.Reader) (int64, error) {
	defer f.Close()
	n, err := io.CopyBuffer(f, ContextReader{ctx, r}, make([]byte, CopyBuffer))
	if err == nil {
		err = f.Close()
	}
	switch {
	case err == nil:
		return n, nil
	case ctx.Err() != nil:
		return n, ctx.Err()
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		return n, providers.Wrap(providers.ErrTooLarge, err, "no space left in the sandbox (its disk limit is reached)")
	}
	return n, err // the reader's, or the file's
}

// CopyBuffer is the buffer size for streaming a file: large enough for
// throughput, small enough that a 1 GiB file passes through a 64 MiB
// GOMEMLIMIT.
const CopyBuffer = 256 << 10

// ContextReader fails reads once Ctx is done, so a large copy stops too.
type ContextReader struct {
	Ctx context.Context
	R   io.Reader
}

func (c ContextReader) Read(p []byte) (int, error) {
	if err := c.Ctx.Err(); err != nil {
		return 0, err
	}
	return c.R.Read(p)
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
