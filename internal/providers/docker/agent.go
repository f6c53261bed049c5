package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// Metrics come from the agent (agentclient.Via).
var _ providers.MetricsReader = (*Docker)(nil)

// Every container runs sandgate's agent (package agent): the binary sits
// in a named volume, sandgate-agent-<hash of the binary>, mounted
// read-only at agentDir in every sandbox, so the gateway need not share a
// filesystem with the daemon. The first connection to a sandbox starts
// the agent as a daemon inside it ("connect --start"); each connection is
// one long-lived exec whose stdin and stdout carry the agent protocol.
// Every command, file and terminal session is then a stream on that
// connection, not an Engine API exec. The agent, with its sessions,
// outlives the connection: a restarted gateway connects again (without
// --start) and finds it; if it is gone, the sandbox is in error.
const (
	agentDir = "/.sandgate"
	agentBin = agentDir + "/sandgate-agent"
	// LabelAgent marks the agent volumes.
	LabelAgent = "sandgate.agent"
)

// agentVolume names the volume for the binary at path and checks it.
func agentVolume(path string) (name string, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("docker: the agent binary: %w (build it with make, or set --agent-binary)", err)
	}
	defer f.Close()
	h := sha256.New()
	size, err = io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("docker: the agent binary: %w", err)
	}
	return "sandgate-agent-" + hex.EncodeToString(h.Sum(nil))[:16], size, nil
}

// ensureAgentVolume makes the agent volume and copies the binary into it,
// once per provider, through a container of image that is created with
// the volume mounted and never started.
func (d *Docker) ensureAgentVolume(ctx context.Context, image string) error {
	d.volMu.Lock()
	defer d.volMu.Unlock()
	if d.volReady {
		return nil
	}
	if _, err := d.cli.VolumeInspect(ctx, d.volName); cerrdefs.IsNotFound(err) {
		_, err = d.cli.VolumeCreate(ctx, volume.CreateOptions{Name: d.volName, Labels: map[string]string{LabelAgent: "1"}})
		if err != nil && !cerrdefs.IsConflict(err) {
			return d.kind(err, "create the agent volume")
		}
	} else if err != nil {
		return d.kind(err, "inspect the agent volume")
	}
	const at = "/sandgate-agent-volume"
	c, err := d.cli.ContainerCreate(ctx, &container.Config{Image: image, Entrypoint: []string{at + "/sandgate-agent"}, Labels: map[string]string{LabelAgent: "1"}},
		&container.HostConfig{Mounts: []mount.Mount{{Type: mount.TypeVolume, Source: d.volName, Target: at}}}, nil, nil, "")
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return providers.Wrap(providers.ErrInvalid, err, fmt.Sprintf("image %q is not on the docker host (this provider does not pull)", image))
		}
		return d.kind(err, "install the agent")
	}
	defer d.cli.ContainerRemove(context.WithoutCancel(ctx), c.ID, container.RemoveOptions{Force: true})
	if st, err := d.cli.ContainerStatPath(ctx, c.ID, at+"/sandgate-agent"); err == nil && st.Size == d.agentSize {
		d.volReady = true
		return nil
	}
	f, err := os.Open(d.opts.AgentBinary)
	if err != nil {
		return fmt.Errorf("docker: the agent binary: %w", err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if err := writeTar(&buf, "sandgate-agent", 0o755, d.agentSize, f); err != nil {
		return fmt.Errorf("docker: the agent binary: %w", err)
	}
	if err := d.cli.CopyToContainer(ctx, c.ID, at, &buf, container.CopyToContainerOptions{}); err != nil {
		return d.kind(err, "install the agent")
	}
	d.volReady = true
	return nil
}

// agentMount is the agent volume, read-only, at agentDir.
func (d *Docker) agentMount() mount.Mount {
	return mount.Mount{Type: mount.TypeVolume, Source: d.volName, Target: agentDir, ReadOnly: true,
		VolumeOptions: &mount.VolumeOptions{NoCopy: true}}
}

// Agent returns the connection to sandbox id's agent, connecting when
// there is none (after a gateway restart) or it broke. A sandbox whose
// agent is gone is ErrConflict with the reason; so is a paused one (its
// agent is frozen).
func (d *Docker) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	d.pausedMu.Lock()
	paused := d.paused[id]
	d.pausedMu.Unlock()
	if paused {
		// The flag may be a moment stale (settlePaused): ask the daemon
		// before refusing, so no refusal outlives the pause.
		info, err := d.cli.ContainerInspect(ctx, id)
		if err != nil {
			return nil, d.kind(err, "sandbox %s", id)
		}
		if info.State == nil || info.State.Paused {
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is paused", id)
		}
		d.setPaused(id, false)
	}
	return d.links.Get(ctx, id)
}

// openAgent opens a connection to sandbox id's agent (agentclient.Links.Open):
// the direct path where it works (direct.go), else one exec of the
// agent's bridge. With start (a new sandbox) the agent daemon is started
// first, by an exec of the bridge; without, a missing daemon means the
// agent died.
func (d *Docker) openAgent(ctx context.Context, id string, start bool) (io.ReadWriteCloser, func() string, error) {
	if d.direct.off == "" {
		if start {
			if err := d.startAgent(ctx, id); err != nil {
				return nil, nil, err
			}
			start = false
		}
		conn, err := d.dialDirect(ctx, id)
		if err == nil {
			d.setTransport(id, TransportDirect)
			return conn, func() string { return "" }, nil
		}
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		if !errors.Is(err, errNotDirect) {
			return nil, nil, err // the sandbox is not there, or the daemon does not answer
		}
		d.log.Info(fallbackMessage, "sandbox", id, "reason", err)
	}
	conn, stderr, err := d.openExec(ctx, id, start)
	if err == nil {
		d.setTransport(id, TransportExec)
	}
	return conn, stderr, err
}

// fallbackMessage is logged when a connection falls back to exec.
const fallbackMessage = "the sandbox's agent is reached through exec"

// directOptions are the client options of a connection openAgent made:
// a direct one opens a connection of its own for each terminal
// attachment and file.
func (d *Docker) directOptions(id string, conn io.ReadWriteCloser) []agentclient.Option {
	if _, ok := conn.(*net.UnixConn); !ok {
		return nil
	}
	return []agentclient.Option{agentclient.WithDirect(func(ctx context.Context) (net.Conn, error) {
		return d.dialDirect(ctx, id)
	})}
}

// startAgent starts sandbox id's agent daemon, if none runs, with an exec
// of the bridge that ends once the daemon answers (its stdin closed at
// once).
func (d *Docker) startAgent(ctx context.Context, id string) error {
	ex, err := d.startExec(ctx, id, execSpec{Cmd: []string{agentBin, "connect", "--start"}, Stdin: true})
	if err != nil {
		return err
	}
	defer ex.hj.Close()
	if err := ex.hj.CloseWrite(); err != nil {
		return d.kind(err, "start the agent of %s", id)
	}
	stderr := &agentclient.Stderr{Max: 4 << 10}
	stop := context.AfterFunc(ctx, func() { ex.hj.Close() })
	_, err = stdcopy.StdCopy(io.Discard, stderr, ex.hj.Reader)
	stop()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return d.kind(err, "start the agent of %s", id)
	}
	st, err := d.cli.ContainerExecInspect(ctx, ex.id)
	if err != nil {
		return d.kind(err, "start the agent of %s", id)
	}
	if st.ExitCode != 0 {
		why := strings.TrimSpace(stderr.String())
		if strings.HasPrefix(why, "exec "+agentBin+":") {
			// The runtime's words (runc: "exec PATH: ERR"): the agent never ran.
			return providers.Wrap(providers.ErrUnavailable, fmt.Errorf("%w: %s", errAgentCannotRun, why), fmt.Sprintf("sandbox %s cannot run sandgate's agent", id))
		}
		if why == "" {
			why = fmt.Sprintf("the bridge exited %d", st.ExitCode)
		}
		return providers.Errorf(providers.ErrUnavailable, "sandbox %s: cannot start its agent: %s", id, why)
	}
	return nil
}

// errAgentCannotRun marks an agent binary that the container runtime
// could not execute in a sandbox (a dynamically linked build, one for
// another architecture): no retry makes it run, so a create fails at
// once instead of at its ready timeout.
var errAgentCannotRun = errors.New("the container runtime cannot execute the agent binary (it must be static and built for the host's architecture)")

// openExec opens a connection to sandbox id's agent through one exec of
// the agent's bridge (with start, the bridge starts the daemon).
func (d *Docker) openExec(ctx context.Context, id string, start bool) (io.ReadWriteCloser, func() string, error) {
	cmd := []string{agentBin, "connect"}
	if start {
		cmd = append(cmd, "--start")
	}
	ex, err := d.startExec(ctx, id, execSpec{Cmd: cmd, Stdin: true})
	if err != nil {
		return nil, nil, err
	}
	pr, pw := io.Pipe()
	stderr := &agentclient.Stderr{Max: 4 << 10}
	go func() {
		_, err := stdcopy.StdCopy(pw, stderr, ex.hj.Reader)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	conn := &execConn{r: pr, hj: ex.hj.Conn, close: func() error { ex.hj.Close(); return pr.Close() }}
	return conn, stderr.String, nil
}

// agentState is StateError when sandbox id's running container has no
// working agent, with why; otherwise "".
func (d *Docker) agentState(ctx context.Context, id string) string {
	if _, err := d.Agent(ctx, id); err == nil {
		return ""
	}
	return d.links.Broken(id)
}

// execConn is an exec attach as one byte stream: stdout demultiplexed
// from the daemon's framing, stdin raw.
type execConn struct {
	r     io.Reader
	hj    io.Writer
	close func() error
	once  sync.Once
	err   error
}

func (c *execConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *execConn) Write(p []byte) (int, error) { return c.hj.Write(p) }
func (c *execConn) Close() error {
	c.once.Do(func() { c.err = c.close() })
	return c.err
}

// requireRunning returns nil if the sandbox's container is running and
// not paused; ErrNotFound if there is none, ErrConflict otherwise.
func (d *Docker) requireRunning(ctx context.Context, id string) error {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return d.kind(err, "sandbox %s", id)
	}
	st, _ := stateOf(info.State)
	if st != providers.StateRunning {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, st)
	}
	return nil
}

// writeTar writes a one-file tar of size bytes from src to w.
func writeTar(w io.Writer, name string, mode, size int64, src io.Reader) error {
	tw := tar.NewWriter(w)
	now := time.Now()
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: size,
		ModTime: now, AccessTime: now, ChangeTime: now, Format: tar.FormatPAX,
	}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, src, size); err != nil {
		return err
	}
	return tw.Close()
}
