package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
)

// Exec runs req.Command in the sandbox with bash -c (sh -c if the sandbox
// has no /bin/bash), as its own session and process group, through the
// agent server in the sandbox's init (package agent, the data plane every
// provider shares): timeouts, cancel and return kill the command's tree,
// its output is capped there, and its duration and usage measured there.
// See providers.ExecRequest for the semantics. ErrConflict if the sandbox
// is paused or stopped, ErrInvalid for a bad request or a command that
// cannot start (unknown user, missing cwd); ErrUnavailable if init does
// not answer.
func (l *Local) Exec(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	sb, err := l.running(id)
	if err != nil {
		return providers.ExecResult{}, err
	}
	if req, err = req.Check(); err != nil {
		return providers.ExecResult{}, err
	}
	c, err := sb.agent(ctx) // not l.Agent: the sandbox's state was read just now
	if err != nil {
		return providers.ExecResult{}, err
	}
	res, err := c.Exec(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", id, ctx.Err())
		}
		if s := sb.state(); s != providers.StateRunning {
			return providers.ExecResult{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, s)
		}
		if errors.Is(err, agentclient.ErrGone) {
			sb.dropHost()
		}
		return providers.ExecResult{}, err
	}
	return res, nil
}

// oomKills is how many processes the kernel has killed in the sandbox for
// want of memory (0 without a memory cgroup).
func (sb *sandbox) oomKills() int64 {
	dir := sb.st.Cgroups["memory"]
	if dir == "" {
		return 0
	}
	return procfs.OOMKills(dir + "/memory.oom_control")
}

// memoryLimit is the sandbox's memory limit in bytes.
func (sb *sandbox) memoryLimit() int64 {
	b, _ := os.ReadFile(sb.st.Cgroups["memory"] + "/memory.limit_in_bytes")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
