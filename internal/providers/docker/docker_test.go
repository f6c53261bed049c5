package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox from spec (Image and ID filled in) that is
// deleted when t ends.
func create(t testing.TB, p *Docker, spec providers.CreateSpec) string {
	t.Helper()
	if spec.Image == "" {
		spec.Image = dockertest.ImageRef
	}
	if spec.ID == "" {
		spec.ID = providertest.NewID()
	}
	if spec.Workdir == "" {
		spec.Workdir = "/workspace"
	}
	spec.ReadyTimeout = time.Minute
	if _, err := p.Create(ctxFor(t, time.Minute), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Delete(context.Background(), spec.ID); err != nil && !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Delete %s: %v", spec.ID, err)
		}
	})
	return spec.ID
}

func run(t testing.TB, p *Docker, id, cmd string) providers.ExecResult {
	t.Helper()
	res, err := p.Exec(ctxFor(t, time.Minute), id, providers.ExecRequest{Command: cmd, Timeout: 30 * time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatalf("Exec %q: %v", cmd, err)
	}
	return res
}

func TestCreateErrors(t *testing.T) {
	p := newProvider(t)
	ctx := ctxFor(t, time.Minute)
	gpu := int64(1)
	for _, c := range []struct {
		name string
		spec providers.CreateSpec
		want string
	}{
		{"no image", providers.CreateSpec{}, "image"},
		{"missing image", providers.CreateSpec{Image: "sandgate-test/no-such-image:1"}, "not on the docker host"},
		{"host network", providers.CreateSpec{Image: dockertest.ImageRef, Options: map[string]any{"network": "host"}}, "provider_options.network"},
		{"bad pids", providers.CreateSpec{Image: dockertest.ImageRef, Options: map[string]any{"pids_limit": "many"}}, "provider_options.pids_limit"},
		{"gpu", providers.CreateSpec{Image: dockertest.ImageRef, Resources: providers.Resources{GPU: &gpu}}, "resources.gpu"},
		{"bad entrypoint", providers.CreateSpec{Image: dockertest.ImageRef, Entrypoint: []string{"/bin/false"}}, "exited during start"},
	} {
		spec := c.spec
		spec.ID = providertest.NewID()
		spec.Workdir = "/w"
		spec.ReadyTimeout = 20 * time.Second
		_, err := p.Create(ctx, spec)
		if !errors.Is(err, providers.ErrInvalid) || !strings.Contains(providers.Message(err), c.want) {
			t.Errorf("%s: %v (message %q), want ErrInvalid mentioning %q", c.name, err, providers.Message(err), c.want)
		}
		if _, err := p.Status(ctx, spec.ID); !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("%s: the failed create left %s behind: %v", c.name, spec.ID, err)
		}
	}
}

// TestEndpoint publishes a port on 127.0.0.1 and reaches busybox httpd
// through it.
func TestEndpoint(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	res, err := p.Exec(ctxFor(t, time.Minute), id, providers.ExecRequest{
		Command: "mkdir -p /www && echo sandgate-httpd > /www/index.html && httpd -p 8080 -h /www", PreserveBackground: true,
		Timeout: 30 * time.Second, MaxOutput: 1024,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("starting httpd: %v %+v", err, res)
	}
	ep, err := p.Endpoint(ctxFor(t, time.Minute), id, 8080)
	if err != nil || !strings.HasPrefix(ep.URL, "http://127.0.0.1:") {
		t.Fatalf("Endpoint: %+v %v", ep, err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	var body string
	testkit.Eventually(t, "httpd through the published port", 20*time.Second, func() bool {
		resp, err := hc.Get(ep.URL + "/index.html")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == 200
	})
	hc.CloseIdleConnections()
	if body != "sandgate-httpd\n" {
		t.Errorf("body %q", body)
	}
	if _, err := p.Endpoint(ctxFor(t, time.Minute), id, 9090); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("undeclared port: %v, want ErrNotFound", err)
	}
}

func TestLimits(t *testing.T) {
	p := newProvider(t)
	mem := int64(64)
	cpu := 0.5
	id := create(t, p, providers.CreateSpec{
		Resources: providers.Resources{MemoryMiB: &mem, CPU: &cpu},
		Options:   map[string]any{"pids_limit": 64},
	})

	t.Run("Config", func(t *testing.T) {
		info, err := p.cli.ContainerInspect(ctxFor(t, time.Minute), id)
		if err != nil {
			t.Fatal(err)
		}
		hc := info.HostConfig
		if hc.Memory != 64<<20 || hc.MemorySwap != 64<<20 || hc.NanoCPUs != 5e8 || hc.PidsLimit == nil || *hc.PidsLimit != 64 ||
			hc.NetworkMode != "none" || hc.Init == nil || !*hc.Init || !(slices.Contains(hc.CapDrop, "NET_RAW") || slices.Contains(hc.CapDrop, "CAP_NET_RAW")) {
			t.Errorf("host config: memory %d swap %d cpus %d pids %v network %q init %v capdrop %v",
				hc.Memory, hc.MemorySwap, hc.NanoCPUs, hc.PidsLimit, hc.NetworkMode, hc.Init, hc.CapDrop)
		}
		if info.Config.Labels[LabelSandbox] != id || info.Config.Labels[LabelInstance] != p.instance {
			t.Errorf("labels %v", info.Config.Labels)
		}
	})
	t.Run("MemoryOOMKilled", func(t *testing.T) {
		// dd's 256 MiB block buffer is touched as it reads: far over 64 MiB.
		res := run(t, p, id, "dd if=/dev/zero of=/dev/null bs=256M count=1")
		if res.ExitCode != 137 {
			t.Errorf("memory hog exited %d (stderr %q), want 137", res.ExitCode, res.Stderr)
		}
		// The sandbox lives on.
		if out := run(t, p, id, "echo alive"); string(out.Stdout) != "alive\n" {
			t.Errorf("after the OOM kill: %q", out.Stdout)
		}
	})
	t.Run("PidsLimit", func(t *testing.T) {
		// Start far more sleeps than the limit allows; the shell reports
		// fork failures and the count stays under the limit.
		// The shell that hits the limit dies; counting uses builtins only.
		res := run(t, p, id, "(i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done) 2>/tmp/bomb.err; "+
			"n=0; for d in /proc/[0-9]*; do n=$((n+1)); done; echo $n; read -r l < /tmp/bomb.err; echo \"$l\"")
		var n int
		fmt.Sscan(string(res.Stdout), &n)
		if n == 0 || n > 64 || !strings.Contains(string(res.Stdout), "fork") {
			t.Errorf("%d processes with a pids limit of 64 (exit %d stdout %q stderr %q)", n, res.ExitCode, res.Stdout, res.Stderr)
		}
		// The leftovers were reaped; a fork works again.
		if out := run(t, p, id, "echo forked | cat"); string(out.Stdout) != "forked\n" {
			t.Errorf("after the fork bomb: %q %q", out.Stdout, out.Stderr)
		}
	})
	t.Run("NoNetwork", func(t *testing.T) {
		// Checked from inside, without sending a packet: only lo exists
		// and the routing table is empty.
		res := run(t, p, id, "ls /sys/class/net; echo ---; tail -n +2 /proc/net/route; echo ---; ip route")
		if got := string(res.Stdout); got != "lo\n---\n---\n" {
			t.Errorf("network none: %q %q", got, res.Stderr)
		}
	})
}

// TestKillMidExec: a container killed during a command ends the Exec
// promptly with ErrConflict.
func TestKillMidExec(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(context.Background(), id, providers.ExecRequest{Command: "echo started; sleep 300", Timeout: 5 * time.Minute, MaxOutput: 1024})
		done <- err
	}()
	testkit.Eventually(t, "the sleep to start", 20*time.Second, func() bool {
		return strings.Contains(string(run(t, p, id, "ps -o comm").Stdout), "sleep")
	})
	if err := p.cli.ContainerKill(ctxFor(t, time.Minute), id, "KILL"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, providers.ErrConflict) {
			t.Errorf("Exec after the kill: %v, want ErrConflict", err)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("Exec took %v to notice", el)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Exec hangs after its container was killed")
	}
	if st, err := p.Status(ctxFor(t, time.Minute), id); err != nil || st != providers.StateStopped {
		t.Errorf("Status after kill: %q %v", st, err)
	}
	if _, err := p.Exec(ctxFor(t, time.Minute), id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 10}); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Exec on a stopped sandbox: %v, want ErrConflict", err)
	}
}

// TestAdoption: a second provider with the same instance id lists and
// serves the first one's sandboxes, and a labelled container that no
// provider made (an orphan) is listed too; another instance's are not.
func TestAdoption(t *testing.T) {
	p1 := newProvider(t)
	id := create(t, p1, providers.CreateSpec{})
	run(t, p1, id, "echo kept > /workspace/f")

	p2 := newProvider(t, func(o *Options) { o.InstanceID = p1.instance })
	other := newProvider(t)
	otherID := create(t, other, providers.CreateSpec{})

	// An orphan: made straight through the Engine API with our labels.
	orphan := providertest.NewID()
	ctx := ctxFor(t, time.Minute)
	c, err := p1.cli.ContainerCreate(ctx, &container.Config{Image: dockertest.ImageRef, Entrypoint: keepAlive,
		Labels: map[string]string{LabelSandbox: orphan, LabelInstance: p1.instance}}, &container.HostConfig{NetworkMode: "none"}, nil, nil, orphan)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p1.cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true}) })

	owned, err := p2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	state := map[string]providers.State{}
	for _, o := range owned {
		state[o.ID] = o.State
	}
	if state[id] != providers.StateRunning || state[orphan] != providers.StateStarting {
		t.Errorf("List of the second provider: %v; want %s running and orphan %s starting (created)", state, id, orphan)
	}
	if _, ok := state[otherID]; ok {
		t.Errorf("List shows another instance's sandbox %s", otherID)
	}
	if out := run(t, p2, id, "cat /workspace/f"); string(out.Stdout) != "kept\n" {
		t.Errorf("adopted sandbox: %q", out.Stdout)
	}
	if err := p2.Delete(ctx, orphan); err != nil {
		t.Errorf("Delete orphan: %v", err)
	}
}

// TestStatusMapping covers the states the conformance suite does not
// reach: created (starting) and exited (stopped).
func TestStatusMapping(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxFor(t, time.Minute)
	if err := p.cli.ContainerStop(ctx, id, container.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Status(ctx, id); st != providers.StateStopped || err != nil {
		t.Errorf("stopped container: %q %v", st, err)
	}
	if _, err := p.WriteFile(ctx, id, "/tmp/x", strings.NewReader("x")); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("WriteFile on a stopped sandbox: %v", err)
	}
}

// TestDockerCLIAvailable documents what the benchmarks and fault tests
// use the CLI for; it only checks that it exists.
func dockerCLI(t testing.TB) string {
	path, err := exec.LookPath("docker")
	testkit.Need(t, "the docker CLI (scripts/ci-docker.sh installs docker.io)", err)
	return path
}
