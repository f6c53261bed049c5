// Package docker is the Docker provider: one container per sandbox, driven
// through the Docker Engine API (never the docker CLI).
//
// Each sandbox is a container named by the sandbox id and labelled
// sandgate.sandbox=<id> and sandgate.instance=<instance id>, so that a
// provider started later with the same instance id finds (List) and serves
// the sandboxes of an earlier one. Commands run through exec-create/attach
// under a small sh wrapper (see exec.go), files move through the archive
// endpoints as streamed tar (files.go), and terminal sessions are execs
// with a TTY (process.go).
//
// Containers are hardened against the code they run (limits.go): memory,
// CPU and pids limits by default, no-new-privileges, a few capabilities
// dropped beyond Docker's defaults, and the daemon's default seccomp
// profile, masked and read-only paths kept. No process is ever signalled
// from the host: signals and kills are execs inside the container.
//
// A sandbox has no network unless it declares ports without an egress
// policy or a group at create; then it gets a bridge network of its own
// (network.go) that the gateway's firewall rules (package hostfw) keep off
// the host and off every other sandbox network. A sandbox without one that
// gets an egress policy or joins a group is attached to the provider's
// egress point (egress.go), which also publishes its ports.
//
// The daemon may be older than the client: the client negotiates the API
// version (Debian's docker.io 20.10 speaks 1.41).
package docker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/hostfw"
)

// Labels every sandbox container carries.
const (
	LabelSandbox  = "sandgate.sandbox"
	LabelInstance = "sandgate.instance"
)

// Defaults for Options.
const (
	DefaultPidsLimit      = 1024
	DefaultMemoryLimitMiB = 2048
	DefaultCPULimit       = 2.0
	DefaultPingTimeout    = 3 * time.Second
)

// DefaultCapDrop are the capabilities dropped from Docker's default set
// unless Options.CapDrop says otherwise: raw sockets, device nodes, audit
// writes and file capabilities are not needed by code under test and widen
// the kernel surface.
var DefaultCapDrop = []string{"NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP"}

// Options configure New.
type Options struct {
	// Host is the daemon address (unix:///var/run/docker.sock,
	// tcp://...). "" = DOCKER_HOST and the other DOCKER_* variables, else
	// the default socket.
	Host string
	// InstanceID names the gateway instance that owns the sandboxes; it is
	// the sandgate.instance label. List reports only this instance's
	// containers. "" = "default".
	InstanceID string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// PidsLimit is the per-sandbox process limit unless the create asks
	// for pids_limit. 0 = DefaultPidsLimit (lowered to MaxPidsLimit when
	// that is less); <0 = unlimited.
	PidsLimit int64
	// MaxPidsLimit is the operator's ceiling on a create's pids_limit:
	// above it the create is ErrInvalid naming the option and the
	// ceiling. 0 = none (the option's own range, 16..4194304). New fails
	// when PidsLimit is above it or unlimited.
	MaxPidsLimit int64
	// DefaultMemoryMiB is a sandbox's memory limit, swap included
	// (Memory = MemorySwap), when the create gives no
	// resources.memory_mib. 0 = DefaultMemoryLimitMiB; <0 = unlimited;
	// 1 to 5 make New fail (the daemon's minimum is 6 MiB).
	DefaultMemoryMiB int64
	// DefaultCPU is the CPUs a sandbox may use (NanoCPUs) when the create
	// gives no resources.cpu. 0 = DefaultCPULimit; <0 = unlimited. Any
	// CPU limit above the daemon's CPU count is lowered to it (the daemon
	// refuses more).
	DefaultCPU float64
	// CapDrop replaces DefaultCapDrop when non-nil.
	CapDrop []string
	// Networks are the operator's networks a create may name in
	// provider_options.network; every sandbox that names one shares it
	// with the others that do (no isolation between them). nil = none.
	// "host" and "container:..." are never allowed. A sandbox that names
	// none and declares ports gets a network of its own (network.go).
	Networks []string
	// UnisolatedNetworks lets sandboxes with ports have their network
	// when the gateway cannot install its firewall rules (not root, no
	// iptables, a remote daemon): they can then reach host listeners.
	// false = such creates are refused (ErrInvalid naming ports).
	UnisolatedNetworks bool
	// Firewall names the host rules (package hostfw). The zero value is
	// the gateway's; tests name their own.
	Firewall hostfw.Config
	// PingTimeout bounds Ping. 0 = DefaultPingTimeout.
	PingTimeout time.Duration
	// AgentBinary is the static sandgate-agent binary every sandbox runs
	// (see agent.go). Required.
	AgentBinary string
	// AgentTransport is how the gateway reaches a sandbox's agent: "" or
	// "auto" = directly on its socket where it can, else through an exec
	// (direct.go); "exec" = always through an exec.
	AgentTransport string
	// Egress configures the egress point that sandboxes with a policy
	// other than none, or in a group, go out through (egress.go); made on
	// first use.
	Egress point.Options
	// VolumeDir is where volumes keep their storage (volumes.go), on the
	// daemon's host; it needs root, loop devices and mkfs. "" = no
	// volumes (ErrUnsupported).
	VolumeDir string
}

// Docker is the Docker provider. It is safe for concurrent use. It starts
// no goroutines of its own outside a call; Processes it starts own theirs.
// Close releases the client's connections; containers keep running.
type Docker struct {
	agentclient.Via // exec, files and processes, through the sandbox's agent
	cli             *client.Client
	links           agentclient.Links
	direct          direct // the direct path to agents (direct.go)
	pausedMu        sync.Mutex
	paused          map[string]bool      // a paused sandbox's agent is frozen
	pausedChanged   map[string]time.Time // when Pause or Resume last acted on a sandbox (settlePaused)
	afterLast       time.Duration        // settleAfterLast; tests lengthen it

	volMu     sync.Mutex // guards volReady
	volReady  bool
	volName   string
	agentSize int64

	log      *slog.Logger
	instance string
	opts     Options

	factsMu sync.Mutex   // guards facts
	facts   *daemonFacts // nil until the daemon has answered Info

	fw       *hostfw.Firewall // nil: the host rules could not be installed
	fwConfig hostfw.Config    // names sandbox bridges, even without fw

	egressMu sync.Mutex // serialises attaching sandboxes (egress.go)
	egress   *point.Lazy
	// afterNetnsOpen, when set (tests), runs between opening a sandbox's
	// namespace and checking its container again.
	afterNetnsOpen func(id string)
}

var (
	_ providers.Provider   = (*Docker)(nil)
	_ providers.Pauser     = (*Docker)(nil)
	_ providers.Endpointer = (*Docker)(nil)
	_ providers.FileLister = (*Docker)(nil)
)

// New returns a provider for the daemon at opts.Host. It does not contact
// the daemon: a daemon that is down at start-up makes calls fail with
// ErrUnavailable until it answers, then everything works without a new
// provider.
func New(opts Options) (*Docker, error) {
	if opts.InstanceID == "" {
		opts.InstanceID = "default"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.PidsLimit == 0 {
		opts.PidsLimit = DefaultPidsLimit
		if opts.MaxPidsLimit > 0 {
			opts.PidsLimit = min(opts.PidsLimit, opts.MaxPidsLimit)
		}
	}
	if m := opts.MaxPidsLimit; m > 0 && (opts.PidsLimit < 0 || opts.PidsLimit > m) {
		return nil, fmt.Errorf("docker: the default pids limit (%d; <0 = none) is over the ceiling of %d", opts.PidsLimit, m)
	}
	switch {
	case opts.DefaultMemoryMiB == 0:
		opts.DefaultMemoryMiB = DefaultMemoryLimitMiB
	case opts.DefaultMemoryMiB > 0 && opts.DefaultMemoryMiB < 6:
		return nil, fmt.Errorf("docker: default memory limit of %d MiB is below the daemon's minimum of 6 MiB", opts.DefaultMemoryMiB)
	}
	if opts.DefaultCPU == 0 {
		opts.DefaultCPU = DefaultCPULimit
	}
	if opts.CapDrop == nil {
		opts.CapDrop = DefaultCapDrop
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = DefaultPingTimeout
	}
	if err := checkTransport(opts.AgentTransport); err != nil {
		return nil, err
	}
	copts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if opts.Host != "" {
		copts = append(copts, client.WithHost(opts.Host))
	}
	cli, err := client.NewClientWithOpts(copts...)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	d := &Docker{cli: cli, log: opts.Logger, instance: opts.InstanceID, opts: opts, paused: map[string]bool{}, pausedChanged: map[string]time.Time{}, afterLast: settleAfterLast, fwConfig: opts.Firewall, egress: point.NewLazy(opts.Egress)}
	d.links.Open, d.links.Running, d.links.Options = d.openAgent, d.requireRunning, d.directOptions
	d.direct = direct{off: directOff(cli.DaemonHost(), opts.AgentTransport), proc: "/proc", sock: strings.TrimPrefix(agentSocket, "/"), targets: map[string]target{}, transport: map[string]string{}}
	d.Via = agentclient.Via{Connect: d.Agent, Links: &d.links}
	if d.volName, d.agentSize, err = agentVolume(opts.AgentBinary); err != nil {
		cli.Close()
		return nil, err
	}
	if d.fw, err = openFirewall(cli.DaemonHost(), opts.Firewall); err != nil {
		if opts.UnisolatedNetworks {
			d.log.Warn("sandboxes with ports are NOT isolated from the host or from each other (--docker-unisolated-networks)", "reason", err)
		} else {
			d.log.Warn("sandboxes with ports will be refused: the gateway cannot isolate their networks (--docker-unisolated-networks allows them unisolated)", "reason", err)
		}
	} else {
		d.log.Info("sandbox networks isolated by the gateway's firewall rules", "iptables", d.fw.Tool(), "chains", d.fw.Config().Chain+"-INPUT, "+d.fw.Config().Chain+"-FORWARD")
	}
	d.remountVolumes()
	return d, nil
}

// Name returns "docker".
func (d *Docker) Name() string { return "docker" }

// Close closes the client's idle connections, the egress point (attached
// sandboxes lose their way out until a new provider attaches them again)
// and releases the host firewall (removed when no other gateway holds it
// and no sandbox network is left). Calls in flight are not interrupted;
// sandboxes keep running.
func (d *Docker) Close() error {
	d.links.Close()
	d.egress.Close()
	var fwErr error
	if d.fw != nil {
		fwErr = d.fw.Close()
	}
	return errors.Join(d.cli.Close(), fwErr)
}

// Ping reports whether the daemon answers within Options.PingTimeout
// (ErrUnavailable if not).
func (d *Docker) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.PingTimeout)
	defer cancel()
	if _, err := d.cli.Ping(ctx); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "docker daemon is not answering")
	}
	return nil
}

// Status maps the container's state to the sandbox states: created and
// restarting are starting, running is running (paused when frozen),
// exited and removing are stopped, dead is error. A missing container is
// ErrNotFound.
func (d *Docker) Status(ctx context.Context, id string) (providers.State, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return providers.StateUnknown, d.kind(err, "sandbox %s", id)
	}
	if info.Config == nil || info.Config.Labels[LabelSandbox] != id {
		return providers.StateUnknown, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	st, err := stateOf(info.State)
	d.setPaused(id, st == providers.StatePaused)
	if st == providers.StateRunning && d.agentState(ctx, id) != "" {
		return providers.StateError, nil
	}
	return st, err
}

// StateReason says why sandbox id is in error ("" when it is not).
func (d *Docker) StateReason(id string) string { return d.links.Broken(id) }

func (d *Docker) setPaused(id string, paused bool) {
	d.pausedMu.Lock()
	defer d.pausedMu.Unlock()
	if paused {
		d.paused[id] = true
	} else {
		delete(d.paused, id)
	}
}

// forgetPause drops what the provider keeps about sandbox id's pauses.
func (d *Docker) forgetPause(id string) {
	d.pausedMu.Lock()
	defer d.pausedMu.Unlock()
	delete(d.paused, id)
	delete(d.pausedChanged, id)
}

func stateOf(s *container.State) (providers.State, error) {
	if s == nil {
		return providers.StateUnknown, nil
	}
	if s.Paused {
		return providers.StatePaused, nil
	}
	return mapState(s.Status), nil
}

func mapState(status string) providers.State {
	switch status {
	case container.StateCreated, container.StateRestarting:
		return providers.StateStarting
	case container.StateRunning:
		return providers.StateRunning
	case container.StatePaused:
		return providers.StatePaused
	case container.StateExited, container.StateRemoving:
		return providers.StateStopped
	case container.StateDead:
		return providers.StateError
	}
	return providers.StateUnknown
}

// List reports every container labelled with this instance's id, in any
// state.
func (d *Docker) List(ctx context.Context) ([]providers.Owned, error) {
	cs, err := d.cli.ContainerList(ctx, container.ListOptions{
		All:     true,
		Filters: filters.NewArgs(filters.Arg("label", LabelInstance+"="+d.instance), filters.Arg("label", LabelSandbox)),
	})
	if err != nil {
		return nil, d.kind(err, "list sandboxes")
	}
	nets, err := d.networkSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]providers.Owned, 0, len(cs))
	seen := make(map[string]bool, len(cs))
	for _, c := range cs {
		id := c.Labels[LabelSandbox]
		if id == "" {
			continue
		}
		st := mapState(string(c.State))
		d.setPaused(id, st == providers.StatePaused)
		out = append(out, providers.Owned{ID: id, State: st})
		seen[id] = true
	}
	// A network without its container (a create or delete cut short) is
	// a stopped sandbox: reconciliation deletes it unless a record holds
	// it (a create in flight on another replica).
	for _, id := range nets {
		if !seen[id] {
			seen[id] = true
			out = append(out, providers.Owned{ID: id, State: providers.StateStopped})
		}
	}
	return out, nil
}

// Delete force-removes the container and its anonymous volumes, then
// the sandbox's own network. ErrNotFound if there is neither.
func (d *Docker) Delete(ctx context.Context, id string) error {
	d.links.Drop(id)
	d.dropDirect(id)
	// After the container is gone: an attach racing this delete either
	// finished before (and is undone here) or finds no container.
	defer d.detachEgress(id)
	d.forgetPause(id)
	err := d.cli.ContainerRemove(ctx, id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	switch {
	case err != nil && cerrdefs.IsConflict(err) && strings.Contains(err.Error(), "already in progress"):
		return nil // that delete removes the network
	case err != nil && !cerrdefs.IsNotFound(err):
		return d.kind(err, "delete sandbox %s", id)
	}
	removed, nerr := d.removeNetwork(ctx, id)
	if nerr != nil {
		return nerr
	}
	if err != nil && !removed {
		return d.kind(err, "delete sandbox %s", id)
	}
	return nil
}

// Pause freezes every process of the sandbox. ErrConflict if it is not
// running (already paused, or stopped).
func (d *Docker) Pause(ctx context.Context, id string) error {
	if err := d.cli.ContainerPause(ctx, id); err != nil {
		return d.kind(err, "pause sandbox %s", id)
	}
	return d.settlePaused(ctx, id, true, d.pauseChanged(id, true))
}

// Resume thaws a paused sandbox. ErrConflict if it is not paused.
func (d *Docker) Resume(ctx context.Context, id string) error {
	if err := d.cli.ContainerUnpause(ctx, id); err != nil {
		return d.kind(err, "resume sandbox %s", id)
	}
	return d.settlePaused(ctx, id, false, d.pauseChanged(id, false))
}

// pauseChanged marks sandbox id paused (or not) after a Pause (or Resume)
// that did it, notes when, and returns when one last did before (zero:
// never, here). A refused call changes nothing and is not noted.
func (d *Docker) pauseChanged(id string, paused bool) time.Time {
	d.setPaused(id, paused)
	d.pausedMu.Lock()
	defer d.pausedMu.Unlock()
	prev := d.pausedChanged[id]
	d.pausedChanged[id] = time.Now()
	return prev
}

// How Pause and Resume wait for the daemon's record to agree with what
// they did: polled every settlePoll, it must hold for settleHold, and
// for settleAfterLast since the Pause or Resume before (whose event may
// be the late one); they give up waiting (but still succeed) after
// settleWait.
const (
	settlePoll      = 10 * time.Millisecond
	settleHold      = 50 * time.Millisecond
	settleAfterLast = 500 * time.Millisecond
	settleWait      = 5 * time.Second
)

// settlePaused waits until the daemon has reported the container paused
// (or not) for settleHold, and for settleAfterLast since prev, the
// previous Pause or Resume. dockerd sets its flag when the pause or
// unpause call returns and again when containerd's event for it arrives,
// so the event of a pause, late on a loaded machine, can mark a container
// that was just resumed as paused until the resume's own event arrives
// (and the other way round); a Status or Exec in that moment would see
// the wrong state. Only a quick succession needs the second wait: a
// sandbox resumed seconds after its pause had that pause's event long
// before. If the record has not settled within settleWait the call still
// succeeds: the container did what was asked, and Status and Agent read
// the daemon again.
func (d *Docker) settlePaused(ctx context.Context, id string, paused bool, prev time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	tick := time.NewTicker(settlePoll)
	defer tick.Stop()
	var since time.Time
	for {
		info, err := d.cli.ContainerInspect(ctx, id)
		switch {
		case err != nil && ctx.Err() == nil:
			return d.kind(err, "sandbox %s", id)
		case err == nil && info.State != nil && info.State.Paused == paused:
			if since.IsZero() {
				since = time.Now()
			} else if time.Since(since) >= settleHold && time.Since(prev) >= d.afterLast {
				return nil
			}
		default:
			since = time.Time{}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Endpoint returns http://127.0.0.1:<host port> for a port declared at
// create (published on the loopback address at a random host port: by
// the daemon, or for a sandbox without a network by the egress point,
// egress.go). ErrNotFound if the port was not declared or the sandbox is
// not running.
func (d *Docker) Endpoint(ctx context.Context, id string, port int) (providers.Endpoint, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return providers.Endpoint{}, d.kind(err, "sandbox %s", id)
	}
	if info.HostConfig != nil && info.HostConfig.NetworkMode == "none" && info.Config != nil {
		if _, ok := info.Config.ExposedPorts[portKey(port)]; ok {
			return d.routedEndpoint(ctx, id, port)
		}
	}
	if info.NetworkSettings != nil {
		for _, b := range info.NetworkSettings.Ports[portKey(port)] {
			if b.HostIP == loopback && b.HostPort != "" {
				return providers.Endpoint{URL: "http://" + net.JoinHostPort(loopback, b.HostPort)}, nil
			}
		}
	}
	return providers.Endpoint{}, providers.Errorf(providers.ErrNotFound, "port %d of sandbox %s is not published", port, id)
}

// kind wraps a Docker client error in the matching error kind, with a
// client-safe message built from format (the raw error is kept as cause).
// Context errors are returned as they are so callers can match them.
func (d *Docker) kind(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	case unavailable(err):
		return providers.Wrap(providers.ErrUnavailable, err, what+": docker daemon is unreachable")
	case cerrdefs.IsNotFound(err):
		return providers.Wrap(providers.ErrNotFound, err, what+": not found")
	case cerrdefs.IsConflict(err) || stateError(err):
		return providers.Wrap(providers.ErrConflict, err, what+": "+conflictReason(err))
	case cerrdefs.IsInvalidArgument(err):
		return providers.Wrap(providers.ErrInvalid, err, what+": invalid request")
	}
	return providers.Wrap(providers.ErrUnavailable, err, what+": docker daemon error")
}

// conflictReason turns a daemon conflict into a short client-safe reason.
func conflictReason(err error) string {
	s := strings.ToLower(err.Error())
	switch {
	case strings.Contains(s, "is paused"), strings.Contains(s, "already paused"):
		return "sandbox is paused"
	case strings.Contains(s, "not paused"):
		return "sandbox is not paused"
	case strings.Contains(s, "not running"):
		return "sandbox is not running"
	case strings.Contains(s, "already in use"):
		return "sandbox already exists"
	}
	return "wrong state"
}

// stateError reports whether err is a daemon's complaint about the
// container's state that older daemons send as a 500 (API 1.41 answers an
// unpause of a running container so).
func stateError(err error) bool {
	s := err.Error()
	for _, m := range []string{"is not paused", "is already paused", "is paused", "is not running", "is restarting"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// unavailable reports whether err means the daemon could not be reached
// (refused, socket missing, reset, dial timeout).
func unavailable(err error) bool {
	if client.IsErrConnectionFailed(err) {
		return true
	}
	for _, e := range []error{syscall.ECONNREFUSED, syscall.ENOENT, syscall.ECONNRESET, syscall.EPIPE} {
		if errors.Is(err, e) {
			return true
		}
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return true
	}
	return strings.Contains(err.Error(), "cannot connect to the Docker daemon")
}
