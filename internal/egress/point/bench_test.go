package point_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

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
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n", path); err != nil {
		return 0, err
	}
	res, err := http.ReadResponse(bufio.NewReaderSize(c, 64<<10), nil)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	return io.Copy(io.Discard, res.Body)
}

// BenchmarkEgress compares, in one run, a connection's setup (a fresh
// connection's first request and answer) and a 1 GiB download through the
// egress point against the same over a plain veth between two namespaces.
// The point admits a.test by name (so port 80's Host is checked).
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
	paths := []struct {
		name string
		box  *box
		addr string
	}{
		{"direct", direct, "10.99.0.2:80"},
		{"point", viaPoint, egresstest.A.String() + ":80"},
	}
	for _, pt := range paths {
		b.Run("setup/"+pt.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := roundTrip(pt.box, pt.addr, "/who"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	const size = 1 << 30
	for _, pt := range paths {
		b.Run("download1GiB/"+pt.name, func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				n, err := roundTrip(pt.box, pt.addr, fmt.Sprintf("/bytes?n=%d", size))
				if err != nil || n != size {
					b.Fatalf("%d bytes, %v", n, err)
				}
			}
		})
	}
}
