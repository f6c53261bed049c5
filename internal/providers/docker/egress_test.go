package docker

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/docker/hostfw"
	"github.com/sandgate/sandgate/internal/testkit"
)

// egressProvider is a provider whose egress point resolves the test
// internet's names and dials from its namespace.
func egressProvider(t *testing.T, in *egresstest.Internet, mod ...func(*Options)) *Docker {
	t.Helper()
	resolve := map[string][]netip.Addr{}
	for n, a := range egresstest.Names {
		resolve[n] = []netip.Addr{a}
	}
	return newProvider(t, append([]func(*Options){func(o *Options) {
		o.Egress = point.Options{Resolve: resolve, EgressNetns: in.NetnsPath}
	}}, mod...)...)
}

// fetch is the answer to GET /who from sandbox id at addr (a name or an
// address) naming host (Host on HTTP, SNI on HTTPS), or "" when it fails.
func fetch(t *testing.T, p *Docker, id string, tls bool, addr, host string) string {
	t.Helper()
	return egresstest.WhoAnswer(run(t, p, id, egresstest.BusyboxWho(tls, addr, host)).Stdout)
}

func allow(t *testing.T, entries ...string) egress.Policy {
	t.Helper()
	pol, bad := egress.NewRules(entries, nil)
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	return pol
}

// TestEgress: a docker sandbox's policy through the egress point, from a
// root that holds NET_ADMIN and NET_RAW (cap_add) and uses them to get
// around it; the hostname and capabilities a create asks for.
func TestEgress(t *testing.T) {
	t.Parallel()
	dockertest.Require(t)
	in := egresstest.Start(t)
	p := egressProvider(t, in)
	ctx := ctxFor(t, 3*time.Minute)
	id := create(t, p, providers.CreateSpec{Hostname: "web-1", CapAdd: []string{"NET_ADMIN", "NET_RAW"}})

	if out := strings.TrimSpace(string(run(t, p, id, "hostname").Stdout)); out != "web-1" {
		t.Errorf("hostname %q, want web-1", out)
	}
	// CapEff bits 12 (NET_ADMIN) and 13 (NET_RAW).
	status := procStatus(string(run(t, p, id, "cat /proc/self/status").Stdout))
	eff, err := strconv.ParseUint(status["CapEff"], 16, 64)
	if err != nil || eff&(1<<12) == 0 || eff&(1<<13) == 0 {
		t.Fatalf("CapEff %q: want NET_ADMIN and NET_RAW (%v)", status["CapEff"], err)
	}
	if out := strings.TrimSpace(string(run(t, p, id, "ls /sys/class/net").Stdout)); out != "lo" {
		t.Errorf("links before a policy: %q", out)
	}

	if err := p.SetEgress(ctx, id, allow(t, "a.test")); err != nil {
		t.Fatalf("SetEgress: %v", err)
	}
	if got := fetch(t, p, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Errorf("a.test: %q", got)
	}
	if res := run(t, p, id, "nslookup a.test"); !resolved(res.Stdout) {
		t.Errorf("a.test unresolved: %s", res.Stdout)
	}
	// TLS: the point reads the SNI before it dials. (Busybox's TLS 1.2
	// client sends no signature_algorithms, which the test internet's Go
	// server refuses, so the handshake's end is not the test: the point's
	// verdict, counted, is.)
	before := p.EgressStats(id)
	fetch(t, p, id, true, "a.test", "a.test")
	if st := p.EgressStats(id); st.Allowed != before.Allowed+1 || st.Denied != before.Denied {
		t.Errorf("TLS to a.test: stats %+v, then %+v; want one more allowed", before, st)
	}
	before = p.EgressStats(id)
	fetch(t, p, id, true, "198.51.100.1", "b.test")
	if st := p.EgressStats(id); st.Denied != before.Denied+1 || st.Allowed != before.Allowed {
		t.Errorf("TLS naming b.test: stats %+v, then %+v; want one more denied", before, st)
	}
	if res := run(t, p, id, "nslookup b.test"); resolved(res.Stdout) {
		t.Errorf("b.test resolved: %s", res.Stdout)
	}
	for _, a := range []string{"198.51.100.2", "203.0.113.5"} {
		if got := fetch(t, p, id, false, a, a); got != "" {
			t.Errorf("%s reached: %q", a, got)
		}
	}
	// a.test's address under b.test's name.
	if got := fetch(t, p, id, false, "198.51.100.1", "b.test"); got != "" {
		t.Errorf("b.test as Host on a.test's address reached: %q", got)
	}
	st := p.EgressStats(id)
	if st.Allowed < 2 || st.Denied < 4 {
		t.Errorf("stats %+v: want at least 2 allowed, 4 denied", st)
	}

	// A runtime change, effective when SetEgress returns.
	if err := p.SetEgress(ctx, id, allow(t, "203.0.113.0/24", "a.test")); err != nil {
		t.Fatal(err)
	}
	if got := fetch(t, p, id, false, "203.0.113.5", "203.0.113.5"); got != "203.0.113.5 203.0.113.5:80" {
		t.Errorf("CIDR rule: %q", got)
	}
	if err := p.SetEgress(ctx, id, allow(t, "a.test")); err != nil {
		t.Fatal(err)
	}
	if got := fetch(t, p, id, false, "203.0.113.5", "203.0.113.5"); got != "" {
		t.Errorf("CIDR after it left the policy: %q", got)
	}

	// Root with NET_ADMIN and NET_RAW: another resolver, another address,
	// raw packets, routes.
	if res := run(t, p, id, "echo nameserver 198.51.100.2 > /etc/resolv.conf && ip addr add 100.64.0.9/30 dev eth0"); res.ExitCode != 0 {
		t.Fatalf("rogue setup: %+v", res)
	}
	if got := fetch(t, p, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Errorf("a.test after the rogue setup: %q (the point's DNS answers whatever the address)", got)
	}
	if res := run(t, p, id, "nslookup b.test"); resolved(res.Stdout) {
		t.Errorf("b.test resolved after resolv.conf changed: %s", res.Stdout)
	}
	if res := run(t, p, id, "nslookup b.test 100.64.0.1"); resolved(res.Stdout) {
		t.Errorf("b.test resolved by the router's address: %s", res.Stdout)
	}
	// Raw ICMP (NET_RAW), from its address and a forged one: dropped.
	for _, cmd := range []string{"ping -c 1 -W 2 198.51.100.1", "ping -c 1 -W 2 100.64.0.1", "ping -c 1 -W 2 -I 100.64.0.9 198.51.100.2"} {
		if res := run(t, p, id, cmd); res.ExitCode == 0 {
			t.Errorf("%s: answered: %s", cmd, res.Stdout)
		}
	}
	if res := run(t, p, id, "ip route replace default dev eth0"); res.ExitCode != 0 {
		t.Fatalf("route: %+v", res)
	}
	if got := fetch(t, p, id, false, "198.51.100.2", "b.test"); got != "" {
		t.Errorf("b.test's address reached after the route changed: %q", got)
	}

	// Delete detaches.
	if err := p.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if pt := p.egress.Made(); pt == nil || pt.Attached(id) {
		t.Errorf("attached after delete (point %v)", pt)
	}
}

// resolved reports whether busybox nslookup's output has an answer.
func resolved(out []byte) bool { return strings.Contains(string(out), "Name:") }

// TestEgressRefused: a sandbox with a network of its own (ports) cannot
// be attached: a policy other than none or a group is ErrUnsupported
// naming why; none is what it has. A stopped sandbox is ErrConflict; a
// daemon not on this host is ErrUnsupported.
func TestEgressRefused(t *testing.T) {
	p := newProvider(t, func(o *Options) { o.Firewall = testFirewall(t) })
	ctx := ctxFor(t, 2*time.Minute)
	ported := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	err := p.SetEgress(ctx, ported, allow(t, "a.test"))
	if !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(providers.Message(err), "network of its own") {
		t.Errorf("policy on a sandbox with ports: %v", err)
	}
	if _, err := p.JoinGroup(ctx, ported, "g"); !errors.Is(err, providers.ErrUnsupported) {
		t.Errorf("group for a sandbox with ports: %v", err)
	}
	if err := p.SetEgress(ctx, ported, egress.Policy{}); err != nil {
		t.Errorf("none on a sandbox with ports: %v", err)
	}

	stopped := create(t, p, providers.CreateSpec{})
	if err := p.cli.ContainerKill(ctx, stopped, "KILL"); err != nil {
		t.Fatal(err)
	}
	waited, failed := p.cli.ContainerWait(ctx, stopped, container.WaitConditionNotRunning)
	select {
	case <-waited:
	case err := <-failed:
		t.Fatal(err)
	}
	if err := p.SetEgress(ctx, stopped, allow(t, "a.test")); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("policy on a stopped sandbox: %v", err)
	}
	if err := p.SetEgress(ctx, "no-such-sandbox", allow(t, "a.test")); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("policy on a missing sandbox: %v", err)
	}

	remote, err := New(Options{Host: "tcp://127.0.0.1:1", AgentBinary: dockertest.AgentBinary(t), UnisolatedNetworks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	err = remote.SetEgress(ctx, "x", allow(t, "a.test"))
	if !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(providers.Message(err), "tcp://127.0.0.1:1") {
		t.Errorf("remote daemon: %v", err)
	}
	if _, err := remote.JoinGroup(ctx, "x", "g"); !errors.Is(err, providers.ErrUnsupported) {
		t.Errorf("remote daemon, group: %v", err)
	}
	if remote.egress.Made() != nil {
		t.Error("a remote daemon's provider made an egress point")
	}
}

// TestJoinGroup: a member is attached (policy none unless it has one) and
// its address is its eth0's. Member-to-member traffic through the API is
// cmd/gateway's TestGroupsDocker.
func TestJoinGroup(t *testing.T) {
	dockertest.Require(t)
	in := egresstest.Start(t)
	p := egressProvider(t, in)
	ctx := ctxFor(t, 2*time.Minute)
	a := create(t, p, providers.CreateSpec{})
	b := create(t, p, providers.CreateSpec{})
	if err := p.SetEgress(ctx, b, allow(t, "a.test")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id, reach string
	}{{a, ""}, {b, "a.test 198.51.100.1:80"}} {
		addr, err := p.JoinGroup(ctx, c.id, "grp-1")
		if err != nil {
			t.Fatalf("JoinGroup %s: %v", c.id, err)
		}
		if !point.DefaultPool.Contains(addr) {
			t.Errorf("address %s outside the pool", addr)
		}
		if out := string(run(t, p, c.id, "ip -4 -o addr show dev eth0").Stdout); !strings.Contains(out, " "+addr.String()+"/30") {
			t.Errorf("eth0 of %s: %q, want %s", c.id, out, addr)
		}
		// Joining keeps the policy: none reaches nothing, b's its host.
		if got := fetch(t, p, c.id, false, "a.test", "a.test"); got != c.reach {
			t.Errorf("%s after joining: %q, want %q", c.id, got, c.reach)
		}
		again, err := p.JoinGroup(ctx, c.id, "grp-1")
		if err != nil || again != addr {
			t.Errorf("JoinGroup again: %s %v, want %s", again, err, addr)
		}
	}
}

// TestEgressReplumb: a new provider (a gateway restart: the old point's
// namespace, and with it every veth, is gone) attaches the same
// sandboxes again.
func TestEgressReplumb(t *testing.T) {
	dockertest.Require(t)
	in := egresstest.Start(t)
	p := egressProvider(t, in)
	ctx := ctxFor(t, 2*time.Minute)
	id := create(t, p, providers.CreateSpec{})
	pol := allow(t, "a.test")
	if err := p.SetEgress(ctx, id, pol); err != nil {
		t.Fatal(err)
	}
	if got := fetch(t, p, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Fatalf("before: %q", got)
	}
	p.egress.Close() // what the old gateway's exit does to its point

	p2 := egressProvider(t, in, func(o *Options) { o.InstanceID = p.instance })
	if err := p2.SetEgress(ctx, id, pol); err != nil {
		t.Fatalf("SetEgress after the point was lost: %v", err)
	}
	if got := fetch(t, p2, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Errorf("after: %q", got)
	}
	if got := fetch(t, p2, id, false, "198.51.100.2", "b.test"); got != "" {
		t.Errorf("b.test after: %q", got)
	}
}

// TestHostnameAndCapAdd: without them a sandbox is "sandbox" and holds
// none of the dropped capabilities; a create's hostname and cap_add (a
// default-dropped one included) are the container's.
func TestHostnameAndCapAdd(t *testing.T) {
	p := newProvider(t)
	caps := func(id string) uint64 {
		t.Helper()
		eff, err := strconv.ParseUint(procStatus(string(run(t, p, id, "cat /proc/self/status").Stdout))["CapEff"], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		return eff
	}
	const netAdmin, netRaw, sysAdmin = 1 << 12, 1 << 13, 1 << 21
	plain := create(t, p, providers.CreateSpec{})
	if out := strings.TrimSpace(string(run(t, p, plain, "hostname").Stdout)); out != "sandbox" {
		t.Errorf("default hostname %q", out)
	}
	if eff := caps(plain); eff&(netAdmin|netRaw|sysAdmin) != 0 {
		t.Errorf("default CapEff %x holds NET_ADMIN, NET_RAW or SYS_ADMIN", eff)
	}
	named := create(t, p, providers.CreateSpec{Hostname: "db", CapAdd: []string{"NET_RAW"}})
	if out := strings.TrimSpace(string(run(t, p, named, "hostname").Stdout)); out != "db" {
		t.Errorf("hostname %q, want db", out)
	}
	if eff := caps(named); eff&netRaw == 0 || eff&(netAdmin|sysAdmin) != 0 {
		t.Errorf("CapEff %x: want NET_RAW and neither NET_ADMIN nor SYS_ADMIN", eff)
	}
}

// TestEgressPidReuse: the namespace is opened from the pid the daemon
// reported; if the container's init changed meanwhile (here: the
// container restarts between the open and the second inspect, as it would
// if its pid were reused), nothing is attached.
func TestEgressPidReuse(t *testing.T) {
	dockertest.Require(t)
	in := egresstest.Start(t)
	p := egressProvider(t, in)
	ctx := ctxFor(t, 2*time.Minute)
	id := create(t, p, providers.CreateSpec{})
	restarted := false
	p.afterNetnsOpen = func(id string) {
		if restarted {
			return
		}
		restarted = true
		if err := p.cli.ContainerRestart(ctx, id, container.StopOptions{}); err != nil {
			t.Errorf("restart: %v", err)
		}
	}
	err := p.SetEgress(ctx, id, allow(t, "a.test"))
	if !restarted || !errors.Is(err, providers.ErrConflict) || !strings.Contains(providers.Message(err), "restarted") {
		t.Fatalf("SetEgress across a restart: %v (restarted %v)", err, restarted)
	}
	if pt := p.egress.Made(); pt != nil && pt.Attached(id) {
		t.Error("attached across a restart")
	}
	// The restarted container (its agent gone with the old init) has only
	// lo: look from the host, through its new init's namespace.
	info, err := p.cli.ContainerInspect(ctx, id)
	if err != nil || info.State == nil || !info.State.Running {
		t.Fatalf("inspect: %v", err)
	}
	links, err := os.ReadDir("/proc/" + strconv.Itoa(info.State.Pid) + "/root/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Name() != "lo" {
		t.Errorf("links after a refused attach: %v", links)
	}
	// Now it attaches.
	p.afterNetnsOpen = nil
	if _, err := p.JoinGroup(ctx, id, "g"); err != nil {
		t.Errorf("JoinGroup after the restart: %v", err)
	}
}

// TestEgressPorts: a create that declares ports and gives a policy (or
// none, explicitly, or a group) makes a sandbox of network none; the egress point
// publishes its ports (the endpoint serves its httpd, an undeclared port
// has none), it reaches what its policy allows and nothing else (no host
// listener, no other address, no link but lo and eth0), and a new
// provider (a gateway restart) publishes and plumbs it again.
func TestEgressPorts(t *testing.T) {
	t.Parallel()
	dockertest.Require(t)
	in := egresstest.Start(t)
	p := egressProvider(t, in)
	ctx := ctxFor(t, 3*time.Minute)
	pol, none := allow(t, "a.test"), egress.Policy{}
	id := create(t, p, providers.CreateSpec{Ports: []int{8080}, Egress: &pol})
	closed := create(t, p, providers.CreateSpec{Ports: []int{8080}, Egress: &none})
	grouped := create(t, p, providers.CreateSpec{Ports: []int{8080}, Group: "g-ports"})
	if err := p.SetEgress(ctx, id, pol); err != nil { // what the service does next
		t.Fatal(err)
	}
	if _, err := p.JoinGroup(ctx, grouped, "g-ports"); err != nil {
		t.Fatalf("JoinGroup of a sandbox with ports: %v", err)
	}
	for _, sb := range []string{id, closed, grouped} {
		info, err := p.cli.ContainerInspect(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		if info.HostConfig.NetworkMode != "none" || len(info.HostConfig.PortBindings) != 0 || len(networksOf(t, sb)) != 0 {
			t.Fatalf("%s: network mode %q, bindings %v, networks %v", sb, info.HostConfig.NetworkMode, info.HostConfig.PortBindings, networksOf(t, sb))
		}
		serveHTTP(t, p, sb, "served-by-"+sb)
	}
	for _, sb := range []string{id, closed, grouped} {
		if got := endpointBody(t, p, sb, 8080); got != "served-by-"+sb+"\n" {
			t.Errorf("endpoint of %s: %q", sb, got)
		}
	}
	if _, err := p.Endpoint(ctx, id, 9090); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("an undeclared port: %v, want ErrNotFound", err)
	}
	if out := strings.Fields(string(run(t, p, id, "ls /sys/class/net").Stdout)); !slices.Equal(out, []string{"eth0", "lo"}) {
		t.Errorf("links: %q, want eth0 and lo", out)
	}
	if got := fetch(t, p, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Errorf("a.test: %q", got)
	}
	if got := fetch(t, p, closed, false, "198.51.100.1", "a.test"); got != "" {
		t.Errorf("policy none reached a.test: %q", got)
	}
	if got := fetch(t, p, id, false, "198.51.100.2", "b.test"); got != "" {
		t.Errorf("b.test reached: %q", got)
	}
	port, accepted := hostListener(t)
	if hosts, out, ok := reachesHost(t, p, id, port, "100.64.0.1", "127.0.0.1"); ok {
		t.Errorf("the sandbox reached the host listener at one of %v, port %d: %s", hosts, port, out)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener accepted %d connections from the sandbox", n)
	}

	p.egress.Close() // what the old gateway's exit does: its listeners go too
	p2 := egressProvider(t, in, func(o *Options) { o.InstanceID = p.instance })
	if got := endpointBody(t, p2, id, 8080); got != "served-by-"+id+"\n" { // attached with none here
		t.Errorf("endpoint after the restart: %q", got)
	}
	if err := p2.SetEgress(ctx, id, pol); err != nil { // the service's restore
		t.Fatal(err)
	}
	if got := fetch(t, p2, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Errorf("a.test after the restart: %q", got)
	}
	if got := fetch(t, p2, id, false, "198.51.100.2", "b.test"); got != "" {
		t.Errorf("b.test after the restart: %q", got)
	}
	// Delete closes its listeners.
	ep, err := p2.Endpoint(ctx, id, 8080)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp4", strings.TrimPrefix(ep.URL, "http://"), 5*time.Second); err == nil {
		c.Close()
		t.Errorf("%s still listens after the delete", ep.URL)
	}
}

// endpointBody is what GET / answers at the endpoint of port of sandbox
// id, which must be on 127.0.0.1, once its server answers 200.
func endpointBody(t *testing.T, p *Docker, id string, port int) string {
	t.Helper()
	ep, err := p.Endpoint(ctxFor(t, time.Minute), id, port)
	if err != nil {
		t.Fatalf("Endpoint of %s: %v", id, err)
	}
	if !strings.HasPrefix(ep.URL, "http://127.0.0.1:") {
		t.Errorf("endpoint %q: want one on 127.0.0.1", ep.URL)
	}
	return testkit.EventuallyGet(t, ep.URL+"/", 20*time.Second)
}

// TestTwoGateways: two gateways (instance ids) on one daemon, sharing the
// host firewall's chains, each with its own egress point. Their sandboxes
// get the same pool address, each in its own router namespace, and both
// work: published ports, policies; each lists only its own. When one
// gateway exits (its point and listeners go), the other's sandboxes keep
// their way out and their ports, and the firewall stays installed.
func TestTwoGateways(t *testing.T) {
	dockertest.Require(t)
	in := egresstest.Start(t)
	fw := testFirewall(t)
	withFW := func(o *Options) { o.Firewall = fw }
	pa, pb := egressProvider(t, in, withFW), egressProvider(t, in, withFW)
	ctx := ctxFor(t, 3*time.Minute)
	pol := allow(t, "a.test")
	ids := map[*Docker]string{}
	for _, p := range []*Docker{pa, pb} {
		id := create(t, p, providers.CreateSpec{Ports: []int{8080}, Egress: &pol})
		if err := p.SetEgress(ctx, id, pol); err != nil {
			t.Fatal(err)
		}
		serveHTTP(t, p, id, "served-by-"+id)
		ids[p] = id
	}
	addrA, okA := pa.egress.Made().Address(ids[pa])
	addrB, okB := pb.egress.Made().Address(ids[pb])
	if !okA || !okB || addrA != addrB {
		t.Errorf("pool addresses %s (%v), %s (%v): want the same, in two router namespaces", addrA, okA, addrB, okB)
	}
	for p, id := range ids {
		if got := endpointBody(t, p, id, 8080); got != "served-by-"+id+"\n" {
			t.Errorf("endpoint of %s: %q", id, got)
		}
		if got := fetch(t, p, id, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
			t.Errorf("a.test from %s: %q", id, got)
		}
		owned, err := p.List(ctx)
		if err != nil || len(owned) != 1 || owned[0].ID != id {
			t.Errorf("List of %s's gateway: %+v %v", id, owned, err)
		}
	}

	if err := pa.Close(); err != nil {
		t.Fatal(err)
	}
	b := ids[pb]
	if got := fetch(t, pb, b, false, "a.test", "a.test"); got != "a.test 198.51.100.1:80" {
		t.Errorf("a.test from %s after the other gateway exited: %q", b, got)
	}
	if got := endpointBody(t, pb, b, 8080); got != "served-by-"+b+"\n" {
		t.Errorf("endpoint of %s after the other gateway exited: %q", b, got)
	}
	if ok, err := hostfw.Installed(fw); !ok || err != nil {
		t.Errorf("the firewall went with one of two gateways: %v %v", ok, err)
	}
}

// TestRoutedPorts: which creates publish their ports through the egress
// point rather than a network of their own.
func TestRoutedPorts(t *testing.T) {
	pol, none := allow(t, "a.test"), egress.Policy{}
	for _, c := range []struct {
		name string
		spec providers.CreateSpec
		opts createOptions
		want bool
	}{
		{"ports, a policy", providers.CreateSpec{Ports: []int{80}, Egress: &pol}, createOptions{}, true},
		{"ports, none given explicitly", providers.CreateSpec{Ports: []int{80}, Egress: &none}, createOptions{}, true},
		{"ports, a group", providers.CreateSpec{Ports: []int{80}, Group: "g1"}, createOptions{}, true},
		{"ports alone", providers.CreateSpec{Ports: []int{80}}, createOptions{}, false},
		{"a policy, no ports", providers.CreateSpec{Egress: &pol}, createOptions{}, false},
		{"an operator's network", providers.CreateSpec{Ports: []int{80}, Egress: &pol}, createOptions{network: "shared"}, false},
	} {
		if got := routedPorts(c.spec, c.opts); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
