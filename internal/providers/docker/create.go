package docker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/go-connections/nat"

	"github.com/sandgate/sandgate/internal/providers"
)

const loopback = "127.0.0.1"

// keepAlive is the entrypoint of a sandbox created without one. docker-init
// (Init: true) is PID 1 and reaps orphans; the shell only has to stay.
var keepAlive = []string{"/bin/sh", "-c", "while :; do sleep 3600; done"}

// createOptions are the provider_options a create may carry.
type createOptions struct {
	network   string // an operator's network; "" = none, or the sandbox's own when it declares ports
	pidsLimit int64  // 0 = Options.PidsLimit
	// routed: the sandbox declares ports but gets no network: its ports
	// are published through the egress point (routedPorts).
	routed bool
}

// parseOptions validates provider_options: every unknown key and every bad
// value is reported at once, each naming its key.
func (d *Docker) parseOptions(in map[string]any) (createOptions, error) {
	var o createOptions
	var bad providers.InvalidFields
	keys := make([]string, 0, len(in))
	for k := range in {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := in[k]
		field := "provider_options." + k
		switch k {
		case "network":
			s, ok := v.(string)
			switch {
			case !ok:
				bad.Add(field, "must be a string")
			case s == "none" || s == "":
			case s == "host" || strings.HasPrefix(s, "container:"):
				bad.Add(field, "network %q is not allowed", s)
			case !slices.Contains(d.opts.Networks, s):
				bad.Add(field, "network %q is not allowed (allowed: %s)", s, strings.Join(append([]string{"none"}, d.opts.Networks...), ", "))
			default:
				o.network = s
			}
		case "pids_limit":
			n, ok := wholeNumber(v)
			switch {
			case ok && d.opts.MaxPidsLimit > 0 && n > d.opts.MaxPidsLimit:
				bad.Add(field, "must be at most %d (the gateway's ceiling)", d.opts.MaxPidsLimit)
			case !ok || n < 16 || n > 1<<22:
				bad.Add(field, "must be an integer from 16 to %d", 1<<22)
			default:
				o.pidsLimit = n
			}
		default:
			bad.Add(field, "unknown option for the docker provider (known: network, pids_limit)")
		}
	}
	return o, bad.Err()
}

// wholeNumber accepts the numeric types a decoded JSON or Go caller uses.
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n != math.Trunc(n) || math.IsInf(n, 0) {
			return 0, false
		}
		return int64(n), true
	case interface{ Int64() (int64, error) }: // json.Number
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

// Create makes and starts the sandbox's container and returns once an exec
// in its workdir succeeds (or spec.ReadyTimeout passes). A sandbox that
// declares ports and names no network gets a network of its own
// (network.go); it needs the host firewall unless
// Options.UnisolatedNetworks (ErrInvalid naming ports). One whose create
// also gives an egress policy (none included) or a group gets none: its
// ports are published through the egress point (routedPorts). On any failure
// the container and network it made are removed. Resources the spec leaves nil get the
// provider's defaults (Options); resources.disk_gib is enforced only where
// the daemon's storage driver can (Extra["disk_limit"] says whether).
// ErrInvalid for a bad spec (missing image, unknown option, unsupported
// resource), ErrConflict if a container of that name exists,
// ErrUnavailable when the daemon cannot be reached.
func (d *Docker) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if spec.Snapshot != "" {
		spec.Image = snapshotRef(spec.Snapshot) // its files, the source's image below them
	}
	opts, err := d.parseOptions(spec.Options)
	var bad providers.InvalidFields
	if err != nil {
		bad = err.(providers.InvalidFields)
	}
	if spec.Image == "" {
		bad.Add("image", "is required by the docker provider")
	}
	if spec.Resources.GPU != nil && *spec.Resources.GPU > 0 {
		bad.Add("resources.gpu", "GPUs are not supported by the docker provider")
	}
	if c := spec.Resources.CPU; c != nil && !(*c >= 0.01 && *c <= 1024) {
		bad.Add("resources.cpu", "must be from 0.01 to 1024")
	}
	if spec.Resources.MemoryMiB != nil && *spec.Resources.MemoryMiB < 6 {
		bad.Add("resources.memory_mib", "must be at least 6")
	}
	opts.routed = routedPorts(spec, opts) && d.canAttach() == nil
	ownNetwork := len(spec.Ports) > 0 && opts.network == "" && !opts.routed
	if ownNetwork {
		d.checkIsolation(&bad)
	}
	if err := bad.Err(); err != nil {
		return providers.Sandbox{}, err
	}
	workdir := spec.Workdir
	if workdir == "" {
		workdir = "/"
	}

	ok := false // the create succeeded: nothing made is removed
	facts, err := d.daemonFacts(ctx)
	if err != nil {
		return providers.Sandbox{}, err
	}
	if err := d.ensureAgentVolume(ctx, spec.Image); err != nil {
		return providers.Sandbox{}, err
	}
	if ownNetwork {
		netID, err := d.createNetwork(ctx, spec.ID)
		if err != nil {
			return providers.Sandbox{}, err
		}
		// Registered first, so it runs after the container's removal.
		defer func() {
			if !ok {
				d.removeNetworkAfterFailure(ctx, spec.ID, netID)
			}
		}()
	}
	mounts, staged, err := d.volumeMounts(spec)
	if err != nil {
		return providers.Sandbox{}, err
	}
	// The container's mounts are its own copies once it started (or it
	// never will).
	defer d.unstage(staged)
	cfg, hc, nc, extra := d.containerConfig(spec, opts, workdir, facts)
	hc.Mounts = append(hc.Mounts, mounts...)
	created, err := d.cli.ContainerCreate(ctx, cfg, hc, nc, nil, spec.ID)
	if err != nil && hc.StorageOpt != nil && storageOptRefused(err) {
		d.log.Warn("the docker daemon refused a disk limit: resources.disk_gib is no longer enforced", "sandbox", spec.ID, "err", err)
		d.noDiskQuota()
		hc.StorageOpt = nil
		extra["disk_limit"] = diskNotEnforced
		created, err = d.cli.ContainerCreate(ctx, cfg, hc, nc, nil, spec.ID)
	}
	if err != nil {
		switch {
		case cerrdefs.IsConflict(err):
			return providers.Sandbox{}, providers.Wrap(providers.ErrConflict, err, "sandbox "+spec.ID+" already exists")
		case cerrdefs.IsNotFound(err) && strings.Contains(err.Error(), "image"):
			return providers.Sandbox{}, providers.Wrap(providers.ErrInvalid, err, fmt.Sprintf("image %q is not on the docker host (this provider does not pull)", spec.Image))
		}
		return providers.Sandbox{}, d.kind(err, "create sandbox %s", spec.ID)
	}
	// From here on, a failure removes what was made, even when ctx is done.
	defer func() {
		if ok {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		d.links.Drop(spec.ID)
		d.dropDirect(spec.ID)
		if err := d.cli.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			d.log.Error("removing a half-made sandbox", "sandbox", spec.ID, "err", err)
		}
	}()

	if err := d.cli.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return providers.Sandbox{}, d.kind(err, "start sandbox %s", spec.ID)
	}
	if err := d.waitReady(ctx, spec.ID, workdir, spec.ReadyTimeout); err != nil {
		return providers.Sandbox{}, err
	}
	ok = true
	extra["container_id"] = created.ID[:12]
	extra["agent_transport"] = d.Transport(spec.ID)
	return providers.Sandbox{ID: spec.ID, Workdir: workdir, Extra: extra}, nil
}

// containerConfig builds the container for spec, and what the sandbox's
// Extra says about its limits.
func (d *Docker) containerConfig(spec providers.CreateSpec, o createOptions, workdir string, f daemonFacts) (*container.Config, *container.HostConfig, *network.NetworkingConfig, map[string]any) {
	env := make([]string, 0, len(spec.Env))
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	entry := keepAlive
	if len(spec.Entrypoint) > 0 {
		entry = spec.Entrypoint
	}
	stop := 1
	hostname := spec.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	cfg := &container.Config{
		Image:       spec.Image,
		Hostname:    hostname,
		Env:         env,
		Entrypoint:  entry,
		Cmd:         []string{},
		WorkingDir:  workdir,
		Labels:      map[string]string{LabelSandbox: spec.ID, LabelInstance: d.instance},
		StopTimeout: &stop,
	}
	init := true
	hc := &container.HostConfig{
		Init:          &init,
		CapDrop:       capDrop(d.opts.CapDrop, spec.CapAdd),
		CapAdd:        spec.CapAdd, // validated by the service against the operator's list
		SecurityOpt:   securityOpt,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		LogConfig:     container.LogConfig{Type: "none"},
		Mounts:        []mount.Mount{d.agentMount()},
		ShmSize:       spec.ShmBytes, // 0: the daemon's default (64 MiB)
	}
	extra := d.setLimits(hc, spec.Resources, o, f)
	netMode := o.network
	switch {
	case netMode != "":
	case len(spec.Ports) > 0 && !o.routed:
		netMode = networkName(spec.ID) // made by Create
	default:
		netMode = "none"
	}
	hc.NetworkMode = container.NetworkMode(netMode)
	if len(spec.Ports) > 0 {
		// A routed sandbox's exposed ports are only the record of what
		// Endpoint may publish: network none binds nothing.
		cfg.ExposedPorts = nat.PortSet{}
		if !o.routed {
			hc.PortBindings = nat.PortMap{}
		}
		for _, p := range spec.Ports {
			k := portKey(p)
			cfg.ExposedPorts[k] = struct{}{}
			if !o.routed {
				hc.PortBindings[k] = []nat.PortBinding{{HostIP: loopback, HostPort: ""}}
			}
		}
	}
	return cfg, hc, nil, extra
}

// capDrop is drop without the capabilities the create adds (the
// operator's allow-list, checked by the service, overrides the provider's
// defaults).
func capDrop(drop, add []string) []string {
	if len(add) == 0 {
		return drop
	}
	out := make([]string, 0, len(drop))
	for _, c := range drop {
		if !slices.Contains(add, c) {
			out = append(out, c)
		}
	}
	return out
}

func portKey(p int) nat.Port { return nat.Port(strconv.Itoa(p) + "/tcp") }

// waitReady polls until the sandbox's container runs, then starts its
// agent and checks, through it, that a command runs in workdir; it fails
// when the container stops or timeout passes.
func (d *Docker) waitReady(ctx context.Context, id, workdir string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 5 * time.Millisecond
	var last error
	for {
		info, err := d.cli.ContainerInspect(ctx, id)
		switch {
		case err != nil && unavailable(err):
			return d.kind(err, "start sandbox %s", id)
		case err != nil:
			last = err
		case info.State != nil && info.State.Running:
			last = d.links.Probe(ctx, id, workdir)
			if last == nil {
				return nil
			}
			if providers.Kind(last) == providers.ErrInvalid || errors.Is(last, errAgentCannotRun) {
				return last
			}
			if why := d.StateReason(id); why != "" {
				return providers.Errorf(providers.ErrUnavailable, "sandbox %s: %s", id, why)
			}
		case info.State != nil && info.State.Status != container.StateCreated && info.State.Status != container.StateRestarting:
			return providers.Errorf(providers.ErrInvalid, "sandbox %s exited during start (exit code %d): check the image and entrypoint", id, info.State.ExitCode)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return providers.Wrap(providers.ErrUnavailable, last, fmt.Sprintf("sandbox %s was not ready within %v", id, timeout))
			}
			return fmt.Errorf("start sandbox %s: %w", id, ctx.Err())
		case <-t.C:
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}
