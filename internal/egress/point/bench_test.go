package point_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// directBox is a box joined to the internet's namespace by a plain veth
// pair (10.99.0.1 ↔ 10.99.0.2): the baseline the egress point is measured
// against. It dials the internet's 10.99.0.2.
func directBox(b *testing.B, in *egresstest.Internet) *box {
	sb := newBox(b)
	inNS, err := netns.GetFromPath(in.NetnsPath)
	if err != nil {
		b.Fatal(err)
	}
	defer inNS.Close()
	h, err := netlink.NewHandleAt(sb.ns)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	ih, err := netlink.NewHandleAt(inNS)
	if err != nil {
		b.Fatal(err)
	}
	defer ih.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1", PeerNamespace: netlink.NsFd(int(inNS))}
	if err := h.LinkAdd(veth); err != nil {
		b.Fatal(err)
	}
	up := func(h *netlink.Handle, name, addr string) {
		l, err := h.LinkByName(name)
		if err == nil {
			a, _ := netlink.ParseAddr(addr)
			err = h.AddrAdd(l, a)
		}
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	up(h, "d0", "10.99.0.1/30")
	up(ih, "d1", "10.99.0.2/30")
	if lo, err := h.LinkByName("lo"); err == nil {
		_ = h.LinkSetUp(lo)
	}
	return sb
}

// roundTrip opens a connection to addr from sb, asks for path and reads
// the whole response; it returns the body's size.
func roundTrip(sb *box, addr, path string) (int64, error) {
	c, err := sb.dial(context.Background(), addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return egresstest.FetchOn(c, path)
}

// BenchmarkEgress compares a connection's setup (a fresh connection's
// first request and answer) and a 1 GiB download through the egress point
// against the same over a plain veth between two namespaces. Each iteration
// runs both paths back to back (in alternating order), so the load of a
// shared machine weighs on both alike; the ratios are reported as metrics:
// setup's point/direct (median over the iterations; the target is ≤ 1.5)
// and the download's point/direct throughput (over the total; ≥ 0.8). The
// point admits a.test by name, so port 80's Host is checked. Run:
//
//	go test -run '^$' -bench BenchmarkEgress -benchtime 3x ./internal/egress/point/
func BenchmarkEgress(b *testing.B) {
	in := egresstest.Start(b)
	p, err := point.New(point.Options{Resolve: egresstest.Resolve(), EgressNetns: in.NetnsPath})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	viaPoint := newBox(b)
	pol, _ := egress.NewRules([]string{"a.test"}, nil)
	if _, err := p.Attach("sbx-bench", viaPoint.path, pol); err != nil {
		b.Fatal(err)
	}
	if rc, _ := viaPoint.resolve(b, "a.test"); rc != 0 {
		b.Fatalf("resolve a.test: %d", rc)
	}
	direct := directBox(b, in)
	paths := [2]struct {
		box  *box
		addr string
	}{
		{direct, "10.99.0.2:80"},
		{viaPoint, egresstest.A.String() + ":80"},
	}
	// both runs the two paths once each, the order alternating with i, and
	// returns their durations (direct, point).
	both := func(b *testing.B, i int, path string, want int64) (d [2]time.Duration) {
		for k := range 2 {
			j := (i + k) % 2
			start := time.Now()
			n, err := roundTrip(paths[j].box, paths[j].addr, path)
			d[j] = time.Since(start)
			if err != nil || (want >= 0 && n != want) {
				b.Fatalf("path %d: %d bytes, %v", j, n, err)
			}
		}
		return d
	}
	b.Run("setup", func(b *testing.B) {
		// An iteration is setupsPerOp connections each way, so that one
		// -benchtime (say 3x) suits both sub-benchmarks.
		const setupsPerOp = 100
		var direct, point []time.Duration
		for i := 0; b.Loop(); i++ {
			for k := range setupsPerOp {
				d := both(b, i*setupsPerOp+k, "/who", -1)
				direct, point = append(direct, d[0]), append(point, d[1])
			}
		}
		md, mp := median(direct), median(point)
		b.ReportMetric(float64(md.Microseconds()), "direct-µs")
		b.ReportMetric(float64(mp.Microseconds()), "point-µs")
		b.ReportMetric(float64(mp)/float64(md), "point/direct")
	})
	const size = 1 << 30
	b.Run("download1GiB", func(b *testing.B) {
		var total [2]time.Duration
		for i := 0; b.Loop(); i++ {
			d := both(b, i, fmt.Sprintf("/bytes?n=%d", size), size)
			total[0] += d[0]
			total[1] += d[1]
		}
		mbps := func(d time.Duration) float64 { return float64(b.N) * size / d.Seconds() / 1e6 }
		b.ReportMetric(mbps(total[0]), "direct-MB/s")
		b.ReportMetric(mbps(total[1]), "point-MB/s")
		b.ReportMetric(float64(total[0])/float64(total[1]), "point/direct")
	})
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
