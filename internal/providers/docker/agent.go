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
	"os"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
)

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

// link is the gateway's connection to one sandbox's agent.
type link struct {
	c      *agent.Client
	closer io.Closer // the exec attach
}

// links are the connections, by sandbox, and the sandboxes whose agent is
// gone (with why). linkMu serialises connecting per provider: a connect
// is one exec and rare.
type links struct {
	mu     sync.Mutex
	byID   map[string]*link
	broken map[string]string
	dialMu sync.Mutex
}

// Agent returns the connection to sandbox id's agent, connecting when
// there is none (after a gateway restart) or it broke. A sandbox whose
// agent is gone is ErrConflict with the reason; so is a paused one (its
// agent is frozen).
func (d *Docker) Agent(ctx context.Context, id string) (*agent.Client, error) {
	if c, err := d.cachedAgent(id); c != nil || err != nil {
		return c, err
	}
	d.links.dialMu.Lock()
	defer d.links.dialMu.Unlock()
	if c, err := d.cachedAgent(id); c != nil || err != nil {
		return c, err
	}
	return d.connect(ctx, id, false)
}

func (d *Docker) cachedAgent(id string) (*agent.Client, error) {
	d.links.mu.Lock()
	defer d.links.mu.Unlock()
	if d.paused[id] {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is paused", id)
	}
	if why := d.links.broken[id]; why != "" {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, why)
	}
	if l := d.links.byID[id]; l != nil {
		select {
		case <-l.c.Done():
			delete(d.links.byID, id)
		default:
			return l.c, nil
		}
	}
	return nil, nil
}

// connect opens a connection to sandbox id's agent: one exec of the
// agent's bridge. With start (a new sandbox) the bridge starts the agent
// daemon; without, a missing daemon means the agent died, and the sandbox
// is marked broken.
func (d *Docker) connect(ctx context.Context, id string, start bool) (*agent.Client, error) {
	cmd := []string{agentBin, "connect"}
	if start {
		cmd = append(cmd, "--start")
	}
	ex, err := d.startExec(ctx, id, execSpec{Cmd: cmd, Stdin: true})
	if err != nil {
		if serr := d.settledState(context.WithoutCancel(ctx), id); serr != nil {
			return nil, serr // stopped, paused or gone: that is the answer
		}
		return nil, err
	}
	pr, pw := io.Pipe()
	stderr := &syncBuf{max: 4 << 10}
	go func() {
		_, err := stdcopy.StdCopy(pw, stderr, ex.hj.Reader)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
	}()
	conn := &execConn{r: pr, hj: ex.hj.Conn, close: func() error { ex.hj.Close(); return pr.Close() }}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	c, err := agent.Dial(dctx, conn)
	cancel()
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if serr := d.settledState(context.WithoutCancel(ctx), id); serr != nil {
			return nil, serr
		}
		why := strings.TrimSpace(stderr.String())
		if why == "" {
			why = err.Error()
		}
		// Only a mismatched agent, or a bridge that found no agent where one
		// was started, means the sandbox is broken; anything else (a bridge
		// that could not start under load) may pass.
		if strings.Contains(why, "protocol") || (!start && strings.Contains(why, "no agent answers")) {
			if !start {
				why = "its agent is not running (killed or exited): " + why
			}
			d.links.mu.Lock()
			d.links.broken[id] = why
			d.links.mu.Unlock()
			return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is in error: %s", id, why)
		}
		return nil, providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": cannot reach its agent: "+why)
	}
	d.links.mu.Lock()
	d.links.byID[id] = &link{c: c, closer: conn}
	d.links.mu.Unlock()
	return c, nil
}

// dropAgent closes and forgets sandbox id's connection (its sandbox is
// being deleted).
func (d *Docker) dropAgent(id string) {
	d.links.mu.Lock()
	l := d.links.byID[id]
	delete(d.links.byID, id)
	delete(d.links.broken, id)
	d.links.mu.Unlock()
	if l != nil {
		l.c.Close()
	}
}

// agentState is StateError when sandbox id's running container has no
// working agent, with why; otherwise "".
func (d *Docker) agentState(ctx context.Context, id string) string {
	if _, err := d.Agent(ctx, id); err == nil {
		return ""
	}
	d.links.mu.Lock()
	defer d.links.mu.Unlock()
	return d.links.broken[id]
}

// gone maps an error of a call on an agent connection: a connection that
// ended is the sandbox stopping (ErrConflict/ErrNotFound from its state)
// or its agent dying (the sandbox is then in error).
func (d *Docker) gone(ctx context.Context, id string, err error) error {
	if !errors.Is(err, agent.ErrGone) {
		return err
	}
	// The caller's call failed, but this check must finish, in bounded time.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reconnectTimeout)
	defer cancel()
	if serr := d.requireRunning(ctx, id); serr != nil {
		return serr
	}
	d.links.dialMu.Lock()
	defer d.links.dialMu.Unlock()
	if c, cerr := d.cachedAgent(id); c != nil || cerr != nil {
		if cerr != nil {
			return cerr
		}
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": the connection to its agent broke; try again")
	}
	if _, cerr := d.connect(ctx, id, false); cerr != nil {
		return cerr
	}
	return providers.Wrap(providers.ErrUnavailable, err, "sandbox "+id+": the connection to its agent broke; try again")
}

// reconnectTimeout bounds the check and reconnect after a connection
// broke (a sandbox at its pids limit can make an exec hang).
const reconnectTimeout = 30 * time.Second

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

// syncBuf keeps the first max bytes written to it; safe for concurrent
// use.
type syncBuf struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
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

// settledState is requireRunning after a connection to the agent failed.
// A container being killed reads as running for a moment after its
// processes died, so a running answer is asked again for up to
// settleTime before it counts.
func (d *Docker) settledState(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, settleTime)
	defer cancel()
	for {
		err := d.requireRunning(ctx, id)
		if ctx.Err() != nil {
			return nil // still running as far as the daemon said
		}
		if err != nil {
			return err
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

const settleTime = 2 * time.Second

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
