package docker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
)

// maxArg is Linux's limit on one argument string (MAX_ARG_STRLEN), less
// room for the shell's other arguments: a command runs as bash -c <command>.
const maxArg = 128<<10 - 1024

// stopSettle bounds how long a failed start waits to see whether the
// container is stopping.
const stopSettle = 500 * time.Millisecond

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

// stopped reports whether sandbox id has stopped (or is being removed),
// as the error a call that was running in it returns: ErrConflict
// "sandbox stopped during <what>", or the inspect's error kind
// (ErrNotFound once removed). It polls for up to settle while the
// container still runs and returns nil if it runs on.
func (d *Docker) stopped(ctx context.Context, id string, settle time.Duration, what string) error {
	deadline := time.Now().Add(settle)
	for {
		info, err := d.cli.ContainerInspect(ctx, id)
		switch {
		case err != nil:
			return d.kind(err, "sandbox %s", id)
		case info.State == nil || !info.State.Running || info.State.Dead || info.State.Status == container.StateRemoving:
			return providers.Errorf(providers.ErrConflict, "sandbox %s stopped during %s", id, what)
		}
		if !time.Now().Before(deadline) {
			return nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sandbox %s: %w", id, ctx.Err())
		case <-t.C:
		}
	}
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

// startFailure is the error for an exec the daemon did not start. A
// reason startError cannot place may mean the container is dying (runc
// fails in many ways then), so the container's state decides: a stopped
// or vanished sandbox is ErrConflict/ErrNotFound, like any call that ran
// into a killed container.
func (d *Docker) startFailure(ctx context.Context, id string, err error) error {
	e := startError(err, id)
	if providers.Kind(e) != providers.ErrUnavailable {
		return e
	}
	if serr := d.stopped(context.WithoutCancel(ctx), id, stopSettle, "the start of a command"); serr != nil {
		return serr
	}
	return e
}

// startError maps the daemon's reason for not starting an exec to a kind
// with a client-safe message.
func startError(err error, id string) error {
	s := err.Error()
	switch {
	case strings.Contains(s, "unable to find user"), strings.Contains(s, "no matching entries in passwd"),
		strings.Contains(s, "unable to find group"), strings.Contains(s, "no users found"):
		return providers.Wrap(providers.ErrInvalid, err, "unknown user")
	case strings.Contains(s, "namespace path"), strings.Contains(s, "unable to create new parent process"),
		strings.Contains(s, "cannot exec in a stopped"):
		// runc found the container's init gone: it is dying or dead.
		return providers.Wrap(providers.ErrConflict, err, "sandbox "+id+" is not running")
	case strings.Contains(s, "chdir to cwd"), strings.Contains(s, "chdir"):
		return providers.Wrap(providers.ErrInvalid, err, "working directory does not exist in the sandbox")
	case strings.Contains(s, "executable file not found"), strings.Contains(s, "no such file or directory"):
		return providers.Wrap(providers.ErrInvalid, err, "sandbox "+id+" has no /bin/sh")
	case strings.Contains(s, "is paused"):
		return providers.Wrap(providers.ErrConflict, err, "sandbox "+id+" is paused")
	case strings.Contains(s, "not running"):
		return providers.Wrap(providers.ErrConflict, err, "sandbox "+id+" is not running")
	}
	return providers.Wrap(providers.ErrUnavailable, err, "exec in "+id+" did not start")
}

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
