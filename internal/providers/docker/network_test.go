package docker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/docker/hostfw"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// testFirewall names host rules of the test's own (chains, bridge prefix,
// locks), so that their removal can be checked while other gateways on
// the host hold the gateway's.
func testFirewall(t testing.TB) hostfw.Config {
	n := newNonce()[:4]
	return hostfw.Config{Chain: "SGT-" + strings.ToUpper(n), Prefix: "sgt" + n + "-", LockDir: t.TempDir()}
}

// serveHTTP starts busybox httpd on port 8080 of sandbox id, answering
// body at /.
func serveHTTP(t *testing.T, p *Docker, id, body string) {
	t.Helper()
	res, err := p.Exec(ctxFor(t, time.Minute), id, providers.ExecRequest{
		Command:            "mkdir -p /www && echo " + body + " > /www/index.html && httpd -p 8080 -h /www",
		PreserveBackground: true, Timeout: 30 * time.Second, MaxOutput: 1024,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("starting httpd in %s: %v %+v", id, err, res)
	}
}

// sandboxNetwork inspects sandbox id's own network.
func sandboxNetwork(t *testing.T, id string) network.Inspect {
	t.Helper()
	n, err := dockertest.Client(t).NetworkInspect(ctxFor(t, time.Minute), networkName(id), network.InspectOptions{})
	if err != nil {
		t.Fatalf("the network of %s: %v", id, err)
	}
	return n
}

// networksOf lists the networks labelled with sandbox id.
func networksOf(t *testing.T, id string) []network.Summary {
	t.Helper()
	nets, err := dockertest.Client(t).NetworkList(ctxFor(t, time.Minute), network.ListOptions{Filters: filters.NewArgs(filters.Arg("label", LabelSandbox+"="+id))})
	if err != nil {
		t.Fatal(err)
	}
	return nets
}

// hostListener listens on every IPv4 address of the host and counts the
// connections it accepts; each is answered "host-listener".
func hostListener(t *testing.T) (port int, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			io.WriteString(c, "host-listener\n")
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

// hostIPv4s are the host's own IPv4 addresses outside loopback.
func hostIPv4s(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			out = append(out, n.IP.String())
		}
	}
	return out
}

// reachesHost connects from sandbox id to port on each of the host's IPv4
// addresses and the extra ones, all at once (a refusal is nc's 3 s wait),
// and reports whether the host listener's greeting came back.
func reachesHost(t *testing.T, p *Docker, id string, port int, extra ...string) (hosts []string, out string, ok bool) {
	t.Helper()
	hosts = append(extra, hostIPv4s(t)...)
	var probes strings.Builder
	for _, host := range hosts {
		fmt.Fprintf(&probes, "nc -w 3 %s %d </dev/null & ", host, port)
	}
	res := run(t, p, id, probes.String()+"wait")
	return hosts, string(res.Stdout), strings.Contains(string(res.Stdout), "host-listener")
}

// TestSandboxNetworkIsolation: two sandboxes with ports, each on a network
// of its own. A reaches neither B's service at B's container address nor a
// host listener on 0.0.0.0 (through its bridge's gateway address or any
// other host address), while both published ports serve on 127.0.0.1.
// Deleting them removes their networks and bridges; closing the provider
// removes its firewall rules.
func TestSandboxNetworkIsolation(t *testing.T) {
	t.Parallel()
	fw := testFirewall(t)
	p := newProvider(t, func(o *Options) { o.Firewall = fw })
	if p.fw == nil {
		t.Fatal("the provider could not install its firewall rules (the tests run as root with iptables)")
	}
	if ok, err := hostfw.Installed(fw); !ok || err != nil {
		t.Fatalf("firewall rules not installed: %v", err)
	}
	port, accepted := hostListener(t)
	a := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	b := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	serveHTTP(t, p, a, "service-A")
	serveHTTP(t, p, b, "service-B")

	bridges := map[string]string{}
	for _, id := range []string{a, b} {
		n := sandboxNetwork(t, id)
		br := n.Options["com.docker.network.bridge.name"]
		if !strings.HasPrefix(br, fw.Prefix) || n.Options["com.docker.network.bridge.enable_icc"] != "false" ||
			n.Labels[LabelInstance] != p.instance || len(n.Containers) != 1 {
			t.Fatalf("network of %s: bridge %q, options %v, labels %v, %d containers", id, br, n.Options, n.Labels, len(n.Containers))
		}
		bridges[id] = br
	}
	info, err := dockertest.Client(t).ContainerInspect(ctxFor(t, time.Minute), a)
	if err != nil {
		t.Fatal(err)
	}
	aGateway := info.NetworkSettings.Networks[networkName(a)].Gateway
	info, err = dockertest.Client(t).ContainerInspect(ctxFor(t, time.Minute), b)
	if err != nil {
		t.Fatal(err)
	}
	bIP := info.NetworkSettings.Networks[networkName(b)].IPAddress
	if aGateway == "" || bIP == "" {
		t.Fatalf("A's gateway %q, B's address %q", aGateway, bIP)
	}

	// busybox nc speaks the HTTP (the static busybox's wget crashes).
	get := func(host string) string { return `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 3 ` + host + ` 8080` }
	// The tools work: A fetches its own service.
	if res := run(t, p, a, get("127.0.0.1")); res.ExitCode != 0 || !strings.HasSuffix(string(res.Stdout), "\nservice-A\n") {
		t.Fatalf("A's own service: %+v", res)
	}
	if res := run(t, p, a, get(bIP)); strings.Contains(string(res.Stdout), "service-B") {
		t.Errorf("A reached B's service at %s: %+v", bIP, res)
	}
	if hosts, out, ok := reachesHost(t, p, a, port, aGateway); ok {
		t.Errorf("A reached the host listener at one of %v, port %d: %s", hosts, port, out)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n)
	}
	// The listener answers the host: the refusals above are the firewall's.
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if line != "host-listener\n" {
		t.Fatalf("the host listener said %q", line)
	}
	if res := run(t, p, a, "cat /proc/sys/net/ipv6/conf/all/disable_ipv6"); string(res.Stdout) != "1\n" {
		t.Errorf("IPv6 is on inside the sandbox (the rules are IPv4 only): %+v", res)
	}

	for id, want := range map[string]string{a: "service-A\n", b: "service-B\n"} {
		ep, err := p.Endpoint(ctxFor(t, time.Minute), id, 8080)
		if err != nil {
			t.Fatal(err)
		}
		got := testkit.EventuallyGet(t, ep.URL+"/", 20*time.Second)
		if got != want {
			t.Errorf("published port of %s: %q, want %q", id, got, want)
		}
	}

	for _, id := range []string{a, b} {
		if err := p.Delete(ctxFor(t, time.Minute), id); err != nil {
			t.Fatal(err)
		}
		if nets := networksOf(t, id); len(nets) != 0 {
			t.Errorf("the network of %s outlived its delete: %+v", id, nets)
		}
		if _, err := net.InterfaceByName(bridges[id]); err == nil {
			t.Errorf("bridge %s of %s outlived its delete", bridges[id], id)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, err := hostfw.Installed(fw); ok || err != nil {
		t.Fatalf("firewall rules %s-* left after Close: %v", fw.Chain, err)
	}
}

// TestSandboxWithoutPortsHasNoNetwork: no ports, no network.
func TestSandboxWithoutPortsHasNoNetwork(t *testing.T) {
	p := newProvider(t, func(o *Options) { o.Firewall = testFirewall(t) })
	id := create(t, p, providers.CreateSpec{})
	info, err := dockertest.Client(t).ContainerInspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	if info.HostConfig.NetworkMode != "none" || len(networksOf(t, id)) != 0 {
		t.Fatalf("network mode %q, networks %v", info.HostConfig.NetworkMode, networksOf(t, id))
	}
}

// TestPortsWithoutFirewall: where the rules cannot be installed, a create
// with ports is refused naming ports and leaves nothing behind, unless
// Options.UnisolatedNetworks allows it.
func TestPortsWithoutFirewall(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fw := testFirewall(t)
	fw.LockDir = filepath.Join(file, "locks") // not a directory: Open fails
	p := newProvider(t, func(o *Options) { o.Firewall = fw })
	if p.fw != nil {
		t.Fatal("the firewall opened with an unusable lock directory")
	}
	id := providertest.NewID()
	_, err := p.Create(ctxFor(t, time.Minute), providers.CreateSpec{ID: id, Image: dockertest.ImageRef, Ports: []int{8080}, ReadyTimeout: time.Minute})
	var bad providers.InvalidFields
	if !errors.As(err, &bad) || len(bad) != 1 || bad[0].Field != "ports" || !strings.Contains(bad[0].Message, "--docker-unisolated-networks") {
		t.Fatalf("create with ports: %v, want ErrInvalid naming ports", err)
	}
	if _, err := p.Status(ctxFor(t, time.Minute), id); !errors.Is(err, providers.ErrNotFound) || len(networksOf(t, id)) != 0 {
		t.Fatalf("the refused create left something: %v, networks %v", err, networksOf(t, id))
	}
	// Without ports it works as ever.
	create(t, p, providers.CreateSpec{})

	u := newProvider(t, func(o *Options) { o.Firewall = fw; o.UnisolatedNetworks = true })
	id = create(t, u, providers.CreateSpec{Ports: []int{8080}})
	if n := sandboxNetwork(t, id); !strings.HasPrefix(n.Options["com.docker.network.bridge.name"], fw.Prefix) {
		t.Fatalf("unisolated sandbox network: %+v", n.Options)
	}
}

// TestOrphanNetwork: a sandbox network whose container is gone (a delete
// cut short) is listed as a stopped sandbox, so that reconciliation
// deletes it unless a record holds it; Delete removes it.
func TestOrphanNetwork(t *testing.T) {
	fw := testFirewall(t)
	p := newProvider(t, func(o *Options) { o.Firewall = fw })
	id := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	if err := dockertest.Client(t).ContainerRemove(ctxFor(t, time.Minute), id, container.RemoveOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if len(networksOf(t, id)) != 1 {
		t.Fatal("the network went with its container")
	}
	p2 := newProvider(t, func(o *Options) { o.InstanceID = p.instance; o.Firewall = fw })
	owned, err := p2.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(owned) != 1 || owned[0].ID != id || owned[0].State != providers.StateStopped {
		t.Fatalf("List: %+v, want %s stopped", owned, id)
	}
	if err := p2.Delete(ctxFor(t, time.Minute), id); err != nil {
		t.Fatal(err)
	}
	if nets := networksOf(t, id); len(nets) != 0 {
		t.Fatalf("the orphan network outlived Delete: %+v", nets)
	}
	if err := p2.Delete(ctxFor(t, time.Minute), id); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("second Delete: %v, want ErrNotFound", err)
	}
}
