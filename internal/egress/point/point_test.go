package point_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// box is a stand-in sandbox: a network namespace the test dials from.
type box struct {
	ns      netns.NsHandle
	path    string
	gateway netip.Addr // the router's end, its nameserver
}

func newBox(t testing.TB) *box {
	ns, path := egresstest.OpenNetns(t)
	return &box{ns: ns, path: path}
}

func (b *box) dial(ctx context.Context, addr string) (net.Conn, error) {
	return egresstest.DialFrom(ctx, b.ns, "tcp4", addr)
}

// resolve asks the point's DNS (through whatever nameserver address: all
// port 53 traffic is redirected) for name's A records.
func (b *box) resolve(t testing.TB, name string) (int, []netip.Addr) {
	t.Helper()
	return egresstest.LookupFrom(t, b.ns, "192.0.2.53:53", name)
}

// get fetches url from inside the box; addr overrides where the URL's host
// is dialled (as curl --resolve does).
func (b *box) get(url, addr string) (string, error) { return egresstest.GetFrom(b.ns, url, addr) }

func mustRules(t *testing.T, allow, deny []string) egress.Policy {
	t.Helper()
	p, bad := egress.NewRules(allow, deny)
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	return p
}

func TestPointEnforcesPolicy(t *testing.T) {
	hostLinks := egresstest.Links(t)
	in := egresstest.Start(t)
	reg := prometheus.NewRegistry()
	p, err := point.New(point.Options{Resolve: egresstest.Resolve(), EgressNetns: in.NetnsPath, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	sb := newBox(t)
	if _, err := p.Attach("sbx-1", sb.path, mustRules(t, []string{"a.test", "203.0.113.0/24"}, nil)); err != nil {
		t.Fatal(err)
	}
	if rc, addrs := sb.resolve(t, "a.test"); rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != egresstest.A {
		t.Fatalf("a.test: rcode %d %v", rc, addrs)
	}
	if rc, addrs := sb.resolve(t, "b.test"); rc != dns.RcodeNameError || len(addrs) != 0 {
		t.Fatalf("b.test: rcode %d %v, want NXDOMAIN", rc, addrs)
	}
	if got, err := sb.get("http://a.test/who", egresstest.A.String()); err != nil || got != "a.test 198.51.100.1:80" {
		t.Fatalf("http a.test: %q %v", got, err)
	}
	if got, err := sb.get("https://a.test/who", egresstest.A.String()); err != nil || got != "a.test 198.51.100.1:443" {
		t.Fatalf("https a.test: %q %v", got, err)
	}
	if got, err := sb.get("http://203.0.113.5/who", ""); err != nil || got != "203.0.113.5 203.0.113.5:80" {
		t.Fatalf("cidr: %q %v", got, err)
	}
	for _, c := range []struct{ url, addr string }{
		{"http://198.51.100.2/who", ""},               // b's raw IP
		{"https://b.test/who", egresstest.A.String()}, // SNI b.test to a's address
		{"http://b.test/who", egresstest.A.String()},  // Host b.test to a's address
		{"http://10.1.2.3/who", ""},                   // anywhere else
	} {
		if got, err := sb.get(c.url, c.addr); err == nil {
			t.Errorf("%s via %q: got %q, want refused", c.url, c.addr, got)
		}
	}
	if n := testutil.ToFloat64(counter(t, reg, "denied")); n < 4 {
		t.Errorf("denied connections counted %v, want ≥ 4", n)
	}
	if st := p.Stats("sbx-1"); st.Allowed != 3 || st.Denied < 4 {
		t.Errorf("stats %+v", st)
	}

	// A runtime change: deny wins over allow, in effect at once.
	p.SetPolicy("sbx-1", mustRules(t, []string{"a.test", "b.test"}, []string{"a.test"}))
	if _, err := sb.get("http://a.test/who", egresstest.A.String()); err == nil {
		t.Error("a.test reachable after deny")
	}
	if rc, _ := sb.resolve(t, "b.test"); rc != dns.RcodeSuccess {
		t.Errorf("b.test after allow: rcode %d", rc)
	}
	if got, err := sb.get("http://b.test/who", egresstest.B.String()); err != nil || got != "b.test 198.51.100.2:80" {
		t.Errorf("b.test after allow: %q %v", got, err)
	}

	// ModeNone attached: nothing at all, no names.
	p.SetPolicy("sbx-1", egress.Policy{})
	if rc, _ := sb.resolve(t, "a.test"); rc != dns.RcodeNameError {
		t.Errorf("none: a.test rcode %d", rc)
	}
	if _, err := sb.get("http://203.0.113.5/who", ""); err == nil {
		t.Error("none: CIDR host reachable")
	}

	p.Detach("sbx-1")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	in.Close()
	if added := egresstest.NewLinks(hostLinks, egresstest.Links(t)); len(added) > 0 {
		t.Errorf("links added to the host: %v", added)
	}
}

// counter returns the egress connection counter for result.
func counter(t *testing.T, reg *prometheus.Registry, result string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sandgate_egress_connections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(m.GetCounter().GetValue())
				return g
			}
		}
	}
	t.Fatalf("no %s counter", result)
	return nil
}

// A sandbox that already has an eth0 (a former point's, whose namespace
// the kernel has not torn down yet after a gateway restart, or one the
// sandbox made itself) is attached all the same: the new pair replaces
// it.
func TestAttachReplacesEth0(t *testing.T) {
	in := egresstest.Start(t)
	p, err := point.New(point.Options{Resolve: egresstest.Resolve(), EgressNetns: in.NetnsPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	sb := newBox(t)
	h, err := netlink.NewHandleAt(sb.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// A veth pair of its own (this kernel has no dummy links).
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "own0"}); err != nil {
		t.Fatal(err)
	}
	addr, err := p.Attach("sbx-1", sb.path, mustRules(t, []string{"a.test"}, nil))
	if err != nil {
		t.Fatalf("attach over an eth0: %v", err)
	}
	if _, err := h.LinkByName("own0"); err == nil {
		t.Fatal("the old eth0's pair is still there")
	}
	if rc, _ := sb.resolve(t, "a.test"); rc != dns.RcodeSuccess {
		t.Fatalf("a.test from %s: rcode %d", addr, rc)
	}
	if got, err := sb.get("http://a.test/who", egresstest.A.String()); err != nil || got != "a.test 198.51.100.1:80" {
		t.Fatalf("http a.test from %s: %q %v", addr, got, err)
	}
}
