package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pod is a stand-in for a pod's network namespace: a veth into the test
// internet's namespace (its default route), and sandgate-egress serving in
// it as in a pod's sidecar.
type pod struct {
	ns    netns.NsHandle
	dir   string
	bin   string
	serve *exec.Cmd // the point running now
}

var (
	podAddr = netip.MustParseAddr("10.250.0.1")
	podPeer = netip.MustParseAddr("10.250.0.2") // the internet's end
)

func startPod(t testing.TB, in *egresstest.Internet) *pod {
	t.Helper()
	testkit.RequireRoot(t)
	bin := testkit.Binary(t, "cmd/sandgate-egress", "sandgate-egress", "")
	ns, _ := egresstest.OpenNetns(t)
	inNs, err := netns.GetFromPath(in.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer inNs.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ih, err := netlink.NewHandleAt(inNs)
	if err != nil {
		t.Fatal(err)
	}
	defer ih.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "pod0", PeerNamespace: netlink.NsFd(int(inNs))}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	up := func(h *netlink.Handle, name string, a netip.Addr) netlink.Link {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}})
		}
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("link %s: %v", name, err)
		}
		return l
	}
	if lo, err := h.LinkByName("lo"); err != nil || h.LinkSetUp(lo) != nil {
		t.Fatalf("lo: %v", err)
	}
	eth := up(h, "eth0", podAddr)
	up(ih, "pod0", podPeer)
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: podPeer.AsSlice()}); err != nil {
		t.Fatal(err)
	}

	p := &pod{ns: ns, dir: t.TempDir(), bin: bin}
	p.start(t)
	return p
}

// start runs the point in the pod's namespace until it is killed or t
// ends, and waits until it serves. Its output is logged if t fails.
func (p *pod) start(t testing.TB) {
	t.Helper()
	serve := exec.Command(p.bin, "serve", "--dir", p.dir, "--resolve", egresstest.ResolveFlag())
	var log bytes.Buffer
	serve.Stderr = &log
	// A child forked from a thread in the namespace is in it.
	if err := point.InNetns(p.ns, serve.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = serve.Process.Kill()
		_ = serve.Wait()
		if t.Failed() {
			t.Logf("sandgate-egress serve:\n%s", log.String())
		}
	})
	if out, err := exec.Command(p.bin, "ready", "--dir", p.dir).CombinedOutput(); err != nil {
		t.Fatalf("ready: %v: %s", err, out)
	}
	p.serve = serve
}

// set hands the point a state, as the gateway's exec does.
func (p *pod) set(t testing.TB, state string) {
	t.Helper()
	cmd := exec.Command(p.bin, "set", "--dir", p.dir)
	cmd.Stdin = strings.NewReader(state)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("set %s: %v: %s", state, err, out)
	}
}

// resolve asks whatever nameserver: every port-53 packet reaches the point.
func (p *pod) resolve(t testing.TB, name string) (int, []netip.Addr) {
	t.Helper()
	return egresstest.LookupFrom(t, p.ns, "10.96.0.10:53", name)
}

// get fetches url from inside the pod, dialling addr.
func (p *pod) get(url, addr string) (string, error) { return egresstest.GetFrom(p.ns, url, addr) }

// The pod's point, as its sidecar runs it: a.test over HTTP and HTTPS by
// name, b.test neither by name nor by raw IP, a CIDR rule, a change
// effective when set returns, nothing by default, UDP only to DNS, and a
// restart that starts from the last state.
func TestPodPoint(t *testing.T) {
	in := egresstest.Start(t)
	p := startPod(t, in)
	a, b, c := egresstest.A.String(), egresstest.B.String(), egresstest.CIDRHost.String()

	// None until set: no name, no connection.
	if rc, _ := p.resolve(t, "a.test"); rc != dns.RcodeNameError {
		t.Errorf("none: a.test rcode %d, want NXDOMAIN", rc)
	}
	if got, err := p.get("http://a.test/who", a); err == nil {
		t.Errorf("none: a.test answered %q", got)
	}

	p.set(t, `{"policy": {"allow": ["a.test", "203.0.113.0/24"]}}`)
	if rc, addrs := p.resolve(t, "a.test"); rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != egresstest.A {
		t.Fatalf("a.test: rcode %d %v", rc, addrs)
	}
	if rc, addrs := p.resolve(t, "b.test"); rc != dns.RcodeNameError || len(addrs) != 0 {
		t.Errorf("b.test: rcode %d %v, want NXDOMAIN", rc, addrs)
	}
	if got, err := p.get("http://a.test/who", a); err != nil || got != "a.test "+a+":80" {
		t.Errorf("http a.test: %q %v", got, err)
	}
	if got, err := p.get("https://a.test/who", a); err != nil || got != "a.test "+a+":443" {
		t.Errorf("https a.test: %q %v", got, err)
	}
	if got, err := p.get("http://"+c+"/who", c); err != nil || got != c+" "+c+":80" {
		t.Errorf("cidr: %q %v", got, err)
	}
	for _, tc := range []struct{ url, addr string }{
		{"http://" + b + "/who", b}, // b's raw IP
		{"https://b.test/who", a},   // SNI b.test to a's address
		{"http://b.test/who", a},    // Host b.test to a's address
		{"http://10.1.2.3/who", "10.1.2.3"},
	} {
		if got, err := p.get(tc.url, tc.addr); err == nil {
			t.Errorf("%s via %s: got %q, want refused", tc.url, tc.addr, got)
		}
	}
	// UDP but DNS is dropped: a datagram to the internet never arrives.
	udpReaches(t, in, p, egresstest.A, false)
	// A group's peer (here the internet's end of the veth) is reached on
	// any protocol, while it is one.
	p.set(t, `{"peers": ["`+podPeer.String()+`"]}`)
	udpReaches(t, in, p, podPeer, true)
	p.set(t, `{"peers": []}`)
	udpReaches(t, in, p, podPeer, false)

	// A change is in effect when set returns.
	p.set(t, `{"policy": {"allow": ["b.test"]}}`)
	if rc, addrs := p.resolve(t, "b.test"); rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != egresstest.B {
		t.Fatalf("b.test after the change: rcode %d %v", rc, addrs)
	}
	if got, err := p.get("http://b.test/who", b); err != nil || got != "b.test "+b+":80" {
		t.Errorf("b.test after the change: %q %v", got, err)
	}
	if got, err := p.get("http://a.test/who", a); err == nil {
		t.Errorf("a.test after the change: %q", got)
	}

	// A bad state changes nothing.
	for in, why := range map[string]string{
		`{"policy": {"allow": ["not a name!"]}}`: "not a name",
		`{"peers": ["10.0.0.300"]}`:              "10.0.0.300",
		`not json`:                               "bad state",
	} {
		cmd := exec.Command(p.bin, "set", "--dir", p.dir)
		cmd.Stdin = strings.NewReader(in)
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), why) {
			t.Errorf("set %s: %v %s, want an error naming %q", in, err, out, why)
		}
	}
	if got, err := p.get("http://b.test/who", b); err != nil {
		t.Errorf("b.test after a refused change: %q %v", got, err)
	}

	// A point that dies leaves its rules (no way out while it is down);
	// restarted, it takes up the last state.
	_ = p.serve.Process.Kill()
	_ = p.serve.Wait()
	if got, err := p.get("http://b.test/who", b); err == nil {
		t.Errorf("b.test with the point down: %q", got)
	}
	p.start(t)
	if rc, _ := p.resolve(t, "b.test"); rc != dns.RcodeSuccess {
		t.Errorf("b.test after a restart: rcode %d", rc)
	}
	if got, err := p.get("http://b.test/who", b); err != nil || got != "b.test "+b+":80" {
		t.Errorf("b.test after a restart: %q %v", got, err)
	}
}

// udpReaches sends datagrams from the pod to an address of the internet's
// namespace and fails the test unless one arriving is want.
func udpReaches(t *testing.T, in *egresstest.Internet, p *pod, to netip.Addr, want bool) {
	t.Helper()
	inNs, err := netns.GetFromPath(in.NetnsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer inNs.Close()
	var pc net.PacketConn
	if err := point.InNetns(inNs, func() (err error) { pc, err = net.ListenPacket("udp4", to.String()+":9999"); return err }); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	c, err := egresstest.DialFrom(context.Background(), p.ns, "udp4", to.String()+":9999")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		_, _ = c.Write([]byte("x"))
	}
	// Dropped datagrams give no signal: a bounded wait is the test.
	_ = pc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	_, _, err = pc.ReadFrom(make([]byte, 8))
	if got := err == nil; got != want {
		t.Errorf("a UDP datagram to %v arrived: %v, want %v", to, got, want)
	}
}
