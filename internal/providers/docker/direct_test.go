package docker

import (
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestAgentSocketPath(t *testing.T) {
	if agentSocket != agent.SocketPath {
		t.Fatalf("agentSocket %q, agent.SocketPath %q", agentSocket, agent.SocketPath)
	}
}

// createExtra is create returning the sandbox's Extra.
func createExtra(t *testing.T, p *Docker) (string, map[string]any) {
	t.Helper()
	id := providertest.NewID()
	sb, err := p.Create(ctxFor(t, time.Minute), providers.CreateSpec{ID: id, Image: dockertest.ImageRef, Workdir: "/workspace", ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { p.Delete(ctxFor(t, time.Minute), id) })
	return id, sb.Extra
}

// TestDirectPath: a sandbox's agent is reached directly, and again so
// after a gateway restart (a new provider of the same instance).
func TestDirectPath(t *testing.T) {
	p := newProvider(t)
	id, extra := createExtra(t, p)
	if extra["agent_transport"] != TransportDirect {
		t.Fatalf("extra.agent_transport = %v, want direct", extra["agent_transport"])
	}
	if res := run(t, p, id, "echo hi"); string(res.Stdout) != "hi\n" {
		t.Fatalf("exec: %+v", res)
	}
	p2 := newProvider(t, func(o *Options) { o.InstanceID = p.instance })
	if res := run(t, p2, id, "echo again"); string(res.Stdout) != "again\n" {
		t.Fatalf("exec after a restart: %+v", res)
	}
	if got := p2.Transport(id); got != TransportDirect {
		t.Fatalf("transport after a restart: %q", got)
	}
}

// TestDirectRefusesPlants: whatever the sandbox puts where the gateway
// looks for its agent's socket, the gateway opens nothing but a socket
// beneath the container's root whose listener is in the sandbox's pid
// namespace: never a host path, never blocking on a FIFO, never a
// listener outside the sandbox. Each attempt fails at once (the exec path
// is then used).
func TestDirectRefusesPlants(t *testing.T) {
	p := newProvider(t)
	id, _ := createExtra(t, p)
	ctx := ctxFor(t, 2*time.Minute)
	tg, ok := p.cachedTarget(id)
	if !ok {
		t.Fatal("no target after a direct create")
	}

	// A socket on the host that a followed link would reach.
	hostDir, hostSock, untouched := hostSocket(t)
	defer untouched()

	// A listener on the container's /dev that is not the sandbox's: a
	// process of the host's pid namespace in the container's mounts.
	foreign := exec.Command("nsenter", "-t", strconv.Itoa(tg.pid), "-m", "-r", "-w", "--", agentBin, "serve", "--socket", "/dev/plant-foreign.sock")
	if err := foreign.Start(); err != nil {
		t.Fatalf("nsenter: %v", err)
	}
	defer func() { foreign.Process.Kill(); foreign.Wait() }()

	run(t, p, id, "ln -s "+hostSock+" /dev/plant-symlink && ln -s "+hostDir+" /dev/plant-dirlink && "+
		"ln -s "+agentSocket+" /dev/plant-innerlink && mkfifo /dev/plant-fifo && echo x > /dev/plant-file && mkdir /dev/plant-dir")
	testkit.Eventually(t, "the foreign listener", 30*time.Second, func() bool {
		return run(t, p, id, "test -S /dev/plant-foreign.sock").ExitCode == 0
	})
	for _, c := range []struct{ name, path, why string }{
		{"SymlinkToHostSocket", "dev/plant-symlink", "too many levels of symbolic links"},
		{"SymlinkedParent", "dev/plant-dirlink/host.sock", "too many levels of symbolic links"},
		{"SymlinkToTheAgent", "dev/plant-innerlink", "too many levels of symbolic links"},
		{"FIFO", "dev/plant-fifo", "not a socket"},
		{"RegularFile", "dev/plant-file", "not a socket"},
		{"Directory", "dev/plant-dir", "not a socket"},
		{"Missing", "dev/plant-none", "no such file"},
		{"ListenerOutsideTheSandbox", "dev/plant-foreign.sock", "not in the sandbox's pid namespace"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p.direct.sock = c.path
			start := time.Now()
			conn, err := p.dialDirect(ctx, id)
			if err == nil {
				conn.Close()
				t.Fatal("connected")
			}
			if !errors.Is(err, errNotDirect) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("err %v, want errNotDirect saying %q", err, c.why)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
	untouched()

	// The sandbox's own listener is in its namespace: it is the agent as
	// far as the gateway can tell (as an agent it replaced would be on
	// the exec path), and is spoken to as untrusted as ever.
	res, err := p.Exec(ctx, id, providers.ExecRequest{Command: agentBin + " serve --socket /dev/plant-own.sock >/dev/null 2>&1 &", Timeout: 10 * time.Second, PreserveBackground: true})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("own listener: %+v %v", res, err)
	}
	testkit.Eventually(t, "the sandbox's own listener", 30*time.Second, func() bool {
		return run(t, p, id, "test -S /dev/plant-own.sock").ExitCode == 0
	})
	p.direct.sock = "dev/plant-own.sock"
	conn, err := p.dialDirect(ctx, id)
	if err != nil {
		t.Fatalf("the sandbox's own listener: %v", err)
	}
	conn.Close()
}

// TestDirectFallback: a sandbox that replaced its agent's socket with a
// symlink (to a path that is, on the host, a listening socket) is reached
// through exec after a gateway restart, and the host's socket is never
// connected to.
func TestDirectFallback(t *testing.T) {
	p := newProvider(t)
	id, _ := createExtra(t, p)
	hostDir, hostSock, untouched := hostSocket(t)
	defer untouched()
	// Inside the container the same path leads to the agent.
	run(t, p, id, "mv "+agentSocket+" /dev/real.sock && mkdir -p "+hostDir+" && ln -s /dev/real.sock "+hostSock+" && ln -s "+hostSock+" "+agentSocket)

	p2 := newProvider(t, func(o *Options) { o.InstanceID = p.instance })
	if res := run(t, p2, id, "echo fallback"); string(res.Stdout) != "fallback\n" {
		t.Fatalf("exec: %+v", res)
	}
	if got := p2.Transport(id); got != TransportExec {
		t.Fatalf("transport %q, want exec", got)
	}
}

// hostSocket listens on a unix socket at path in a directory of the
// host; untouched fails the test if anything connected to it so far.
func hostSocket(t *testing.T) (dir, path string, untouched func()) {
	t.Helper()
	dir = t.TempDir()
	path = filepath.Join(dir, "host.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return dir, path, func() {
		t.Helper()
		l.SetDeadline(time.Now())
		if c, err := l.Accept(); err == nil {
			c.Close()
			t.Error("the host's socket was connected to")
		}
	}
}

// TestDirectFallbackAtCreate: a gateway that cannot see the container's
// processes (here: an empty /proc, as in a pid namespace of its own, or
// a daemon on another host) creates sandboxes reached through exec, and
// says so.
func TestDirectFallbackAtCreate(t *testing.T) {
	p := newProvider(t)
	p.direct.proc = t.TempDir()
	id, extra := createExtra(t, p)
	if extra["agent_transport"] != TransportExec {
		t.Fatalf("extra.agent_transport = %v, want exec", extra["agent_transport"])
	}
	if res := run(t, p, id, "echo hi"); string(res.Stdout) != "hi\n" {
		t.Fatalf("exec: %+v", res)
	}
}

// TestAgentTransportOption: an unknown transport is refused by New,
// naming it.
func TestAgentTransportOption(t *testing.T) {
	_, err := New(Options{AgentTransport: "sometimes", AgentBinary: "/nonexistent"})
	if !errors.Is(err, providers.ErrInvalid) || !strings.Contains(err.Error(), `"sometimes"`) {
		t.Fatalf("New with transport sometimes: %v", err)
	}
	if off := directOff("unix:///var/run/docker.sock", ""); off != "" {
		t.Errorf("a local daemon: direct off (%s)", off)
	}
	if off := directOff("tcp://10.0.0.1:2376", ""); off == "" {
		t.Error("a daemon over tcp: direct tried")
	}
	if off := directOff("unix:///var/run/docker.sock", TransportExec); off == "" {
		t.Error("transport exec: direct tried")
	}
}
