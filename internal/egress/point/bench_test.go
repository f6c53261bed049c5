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
	h, ih := handleAt(b, sb.ns), handleAt(b, inNS)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1", PeerNamespace: netlink.NsFd(int(inNS))}
	if err := h.LinkAdd(veth); err != nil {
		b.Fatal(err)
	}
	linkUp(b, h, "d0", "10.99.0.1/30")
	linkUp(b, ih, "d1", "10.99.0.2/30")
	linkUp(b, h, "lo", "")
	return sb
}

// handleAt is a netlink handle in ns, closed when b ends.
func handleAt(b *testing.B, ns netns.NsHandle) *netlink.Handle {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(h.Close)
	return h
}

// linkUp gives h's link name the address addr (a CIDR; "" for none) and
// sets it up.
func linkUp(b *testing.B, h *netlink.Handle, name, addr string) netlink.Link {
	l, err := h.LinkByName(name)
	if err == nil && addr != "" {
		var a *netlink.Addr
		if a, err = netlink.ParseAddr(addr); err == nil {
			err = h.AddrAdd(l, a)
		}
	}
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		b.Fatalf("link %s: %v", name, err)
	}
	return l
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

// benchPath is one way to the internet's a.test server: the box dialling
// and the address it dials.
type benchPath struct {
	name string
	box  *box
	addr string
}

// alternate runs a round trip for path on each of paths once, the order
// rotating with i, and returns their durations (in paths' order); want ≥ 0
// is the body size each must get.
func alternate(b *testing.B, paths []benchPath, i int, path string, want int64) []time.Duration {
	d := make([]time.Duration, len(paths))
	for k := range paths {
		j := (i + k) % len(paths)
		start := time.Now()
		n, err := roundTrip(paths[j].box, paths[j].addr, path)
		d[j] = time.Since(start)
		if err != nil || (want >= 0 && n != want) {
			b.Fatalf("path %s: %d bytes, %v", paths[j].name, n, err)
		}
	}
	return d
}

// benchPaths runs the two sub-benchmarks of BenchmarkEgress over paths,
// paths[0] the baseline: "setup", a fresh connection's first request and
// answer (median per path), and "download1GiB" (throughput over the
// total). Each iteration runs every path back to back, in rotating order,
// so the load of a shared machine weighs on all alike; each path's
// figures and its ratio to the baseline ("name/baseline") are reported as
// metrics.
func benchPaths(b *testing.B, paths []benchPath) {
	base := paths[0].name
	b.Run("setup", func(b *testing.B) {
		// An iteration is setupsPerOp connections each way, so that one
		// -benchtime (say 3x) suits both sub-benchmarks.
		const setupsPerOp = 100
		ds := make([][]time.Duration, len(paths))
		for i := 0; b.Loop(); i++ {
			for k := range setupsPerOp {
				for j, d := range alternate(b, paths, i*setupsPerOp+k, "/who", -1) {
					ds[j] = append(ds[j], d)
				}
			}
		}
		m0 := median(ds[0])
		for j, p := range paths {
			m := median(ds[j])
			b.ReportMetric(float64(m.Microseconds()), p.name+"-µs")
			if j > 0 {
				b.ReportMetric(float64(m)/float64(m0), p.name+"/"+base)
			}
		}
	})
	const size = 1 << 30
	b.Run("download1GiB", func(b *testing.B) {
		total := make([]time.Duration, len(paths))
		for i := 0; b.Loop(); i++ {
			for j, d := range alternate(b, paths, i, fmt.Sprintf("/bytes?n=%d", size), size) {
				total[j] += d
			}
		}
		for j, p := range paths {
			b.ReportMetric(float64(b.N)*size/total[j].Seconds()/1e6, p.name+"-MB/s")
			if j > 0 {
				b.ReportMetric(float64(total[0])/float64(total[j]), p.name+"/"+base)
			}
		}
	})
}

// pointBox is a box attached to a new egress point (dialling from in's
// namespace) under a policy admitting a.test by name, which it has
// resolved: so port 80's Host is checked.
func pointBox(b *testing.B, in *egresstest.Internet) *box {
	p, err := point.New(point.Options{Resolve: egresstest.Resolve(), EgressNetns: in.NetnsPath})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	sb := newBox(b)
	pol, _ := egress.NewRules([]string{"a.test"}, nil)
	if _, err := p.Attach("sbx-bench", sb.path, pol); err != nil {
		b.Fatal(err)
	}
	if rc, _ := sb.resolve(b, "a.test"); rc != 0 {
		b.Fatalf("resolve a.test: %d", rc)
	}
	return sb
}

// BenchmarkEgress compares a connection's setup and a 1 GiB download
// through the egress point against the same over a plain veth between two
// namespaces (benchPaths): the targets are setup's point/direct ≤ 1.5 and
// the download's point/direct ≥ 0.8. Run:
//
//	go test -run '^$' -bench BenchmarkEgress -benchtime 3x ./internal/egress/point/
func BenchmarkEgress(b *testing.B) {
	in := egresstest.Start(b)
	benchPaths(b, []benchPath{
		{"direct", directBox(b, in), "10.99.0.2:80"},
		{"point", pointBox(b, in), egresstest.A.String() + ":80"},
	})
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
