// Package dockertest is test support for code that runs sandboxes on a
// real Docker daemon: the busybox test image (built locally; nothing is
// pulled), a client for poking containers from a test, clean-up by
// instance label, and a unix-socket proxy that can cut a provider off the
// shared daemon without disturbing anyone else.
//
// Outside CI a test that needs the daemon skips when none answers; with
// CI=true it fails (scripts/ci-docker.sh starts one).
package dockertest

import (
	"context"
	"sync"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest/testimage"
	"github.com/sandgate/sandgate/internal/providers/docker/hostfw"
	"github.com/sandgate/sandgate/internal/testkit"
)

// ImageRef is the test image (testimage.Ref).
const ImageRef = testimage.Ref

// LabelInstance is the label the docker provider puts the owning gateway
// instance in (docker.LabelInstance; repeated here because the docker
// package's own tests import this one).
const LabelInstance = "sandgate.instance"

var (
	setupOnce sync.Once
	setupErr  error
)

// Require skips the test (outside CI) or fails it (CI=true) when no
// daemon answers or the test image cannot be built. The first call in a
// process pings the daemon and builds ImageRef unless it exists; later
// calls reuse the outcome.
func Require(t testing.TB) {
	t.Helper()
	setupOnce.Do(func() { setupErr = setup() })
	testkit.Need(t, "a docker daemon (scripts/ci-docker.sh starts one)", setupErr)
}

// Image is Require, then ImageRef.
func Image(t testing.TB) string {
	t.Helper()
	Require(t)
	return ImageRef
}

// Client returns a client for the default daemon (DOCKER_HOST or the
// default socket), closed when t ends. It calls Require first.
func Client(t testing.TB) *client.Client {
	t.Helper()
	Require(t)
	cli, err := newClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func newClient() (*client.Client, error) {
	return client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
}

// RemoveInstance force-removes every container and network labelled with
// the given gateway instance id, and the gateway's host firewall rules if
// no gateway holds them any more, reporting failures with t.Errorf. Meant
// for t.Cleanup: sandboxes outlive their gateway by design, not the test.
func RemoveInstance(t testing.TB, instance string) {
	t.Helper()
	cli, err := newClient()
	if err != nil {
		t.Errorf("remove containers of %s: %v", instance, err)
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", LabelInstance+"="+instance))})
	if err != nil {
		t.Errorf("remove containers of %s: %v", instance, err)
		return
	}
	for _, c := range cs {
		if err := cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove container %s of %s: %v", c.ID[:12], instance, err)
		}
	}
	// Sandbox networks, once their containers are gone; then the rules
	// that guarded them, if this was the last gateway (a killed gateway
	// never removes them itself).
	nets, err := cli.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelInstance+"="+instance))})
	if err != nil {
		t.Errorf("remove networks of %s: %v", instance, err)
	}
	for _, n := range nets {
		if err := cli.NetworkRemove(ctx, n.ID); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove network %s of %s: %v", n.Name, instance, err)
		}
	}
	// Volumes (their storage, the gateway's mounts, is the test's to
	// remove), once no container uses them.
	vols, err := cli.VolumeList(ctx, volume.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelInstance+"="+instance))})
	if err != nil {
		t.Errorf("remove volumes of %s: %v", instance, err)
	}
	for _, v := range vols.Volumes {
		if err := cli.VolumeRemove(ctx, v.Name, true); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove volume %s of %s: %v", v.Name, instance, err)
		}
	}
	if _, err := hostfw.RemoveUnused(hostfw.Config{}); err != nil {
		t.Errorf("remove the gateway's firewall rules: %v", err)
	}
	// Snapshot images (labelled sandgate.snapshot) of the instance.
	ims, err := cli.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelInstance+"="+instance), filters.Arg("label", "sandgate.snapshot"))})
	if err != nil {
		t.Errorf("list snapshot images of %s: %v", instance, err)
		return
	}
	for _, im := range ims {
		if _, err := cli.ImageRemove(ctx, im.ID, image.RemoveOptions{Force: true, PruneChildren: true}); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove snapshot image %s of %s: %v", im.ID, instance, err)
		}
	}
}

func setup() error {
	cli, err := newClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := cli.Ping(pctx); err != nil {
		return err
	}
	return testimage.Ensure(ctx, cli)
}

// AgentBinary is testkit.Agent: the static sandgate-agent, built once
// per test process.
func AgentBinary(t testing.TB) string { return testkit.Agent(t) }
