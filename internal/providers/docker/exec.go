package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
)

// maxArg is Linux's limit on one argument string (MAX_ARG_STRLEN), less
// room for the shell's other arguments: a command runs as bash -c <command>.
const maxArg = 128<<10 - 1024

// Exec runs req.Command through the sandbox's agent, which kills the
// command's whole tree at the timeout, on cancel, and (unless background
// processes are preserved) when it returns. Errors: ErrNotFound (no such
// sandbox), ErrConflict (paused, stopped, or its agent gone), ErrInvalid
// (unknown user, missing cwd, no shell), ErrUnavailable (daemon or agent
// unreachable); ctx's error when ctx ends (the tree is killed first).
func (d *Docker) Exec(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	if len(req.Command) > maxArg {
		return providers.ExecResult{}, providers.Errorf(providers.ErrInvalid, "command is %d bytes; at most %d fit in one argument", len(req.Command), maxArg)
	}
	if req.MaxOutput <= 0 {
		req.MaxOutput = providers.DefaultMaxOutput
	}
	if req.Timeout <= 0 {
		req.Timeout = providers.DefaultExecTimeout
	}
	c, err := d.Agent(ctx, id)
	if err != nil {
		return providers.ExecResult{}, err
	}
	res, err := c.Exec(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", id, ctx.Err())
		}
		return providers.ExecResult{}, d.gone(ctx, id, err)
	}
	return res, nil
}

// ReadFile opens the regular file at p through the sandbox's agent.
func (d *Docker) ReadFile(ctx context.Context, id, p string) (io.ReadCloser, int64, error) {
	c, err := d.Agent(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	r, n, err := c.ReadFile(ctx, p)
	if err != nil {
		return nil, 0, d.gone(ctx, id, err)
	}
	return r, n, nil
}

// WriteFile streams r into the file at p through the sandbox's agent,
// creating parent directories.
func (d *Docker) WriteFile(ctx context.Context, id, p string, r io.Reader) (int64, error) {
	c, err := d.Agent(ctx, id)
	if err != nil {
		return 0, err
	}
	n, err := c.WriteFile(ctx, p, r)
	if err != nil {
		return 0, d.gone(ctx, id, err)
	}
	return n, nil
}

// StartProcess starts a terminal session's process through the sandbox's
// agent (its output is retained there).
func (d *Docker) StartProcess(ctx context.Context, id string, spec providers.ProcessSpec) (providers.Process, error) {
	c, err := d.Agent(ctx, id)
	if err != nil {
		return nil, err
	}
	p, err := agent.StartProcess(ctx, c, spec)
	if err != nil {
		return nil, d.gone(ctx, id, err)
	}
	return p, nil
}

// execSpec is one exec as the provider makes it.
type execSpec struct {
	Cmd        []string
	User       string
	WorkingDir string
	Env        []string
	Stdin      bool
	Tty        bool
}

type startedExec struct {
	id string
	hj types.HijackedResponse
}

// startExec creates and starts an exec with stdout and stderr attached.
func (d *Docker) startExec(ctx context.Context, id string, s execSpec) (startedExec, error) {
	created, err := d.cli.ContainerExecCreate(ctx, id, container.ExecOptions{
		User:         s.User,
		Tty:          s.Tty,
		AttachStdin:  s.Stdin,
		AttachStdout: true,
		AttachStderr: !s.Tty,
		Env:          s.Env,
		WorkingDir:   s.WorkingDir,
		Cmd:          s.Cmd,
		// The escape sequence only applies to TTY stdin; make it one
		// nobody types so ^P stays usable in a shell.
		DetachKeys: detachKeys,
	})
	if err != nil {
		return startedExec{}, d.kind(err, "exec in %s", id)
	}
	hj, err := d.cli.ContainerExecAttach(ctx, created.ID, container.ExecAttachOptions{Tty: s.Tty})
	if err != nil {
		return startedExec{}, d.kind(err, "exec in %s", id)
	}
	return startedExec{id: created.ID, hj: hj}, nil
}

// detachKeys is the TTY detach sequence the daemon watches for: long and
// unlikely, since the daemon holds back a typed prefix of it.
const detachKeys = "ctrl-^,ctrl-],ctrl-^,ctrl-]"

func newNonce() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// StatFile describes the file at p through the sandbox's agent.
func (d *Docker) StatFile(ctx context.Context, id, p string) (providers.FileInfo, error) {
	c, err := d.Agent(ctx, id)
	if err != nil {
		return providers.FileInfo{}, err
	}
	fi, err := c.StatFile(ctx, p)
	if err != nil {
		return providers.FileInfo{}, d.gone(ctx, id, err)
	}
	return fi, nil
}

// ListDir lists the directory at p through the sandbox's agent.
func (d *Docker) ListDir(ctx context.Context, id, p string) ([]providers.FileInfo, bool, error) {
	c, err := d.Agent(ctx, id)
	if err != nil {
		return nil, false, err
	}
	entries, truncated, err := c.ListDir(ctx, p)
	if err != nil {
		return nil, false, d.gone(ctx, id, err)
	}
	return entries, truncated, nil
}
