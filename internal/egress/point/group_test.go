package point_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
)

// serve listens on TCP and UDP port 7000 of b's namespace and answers each
// connection or datagram with tag; it stops with the test.
func (b *box) serve(t *testing.T, tag string) {
	t.Helper()
	var l net.Listener
	var pc net.PacketConn
	err := point.InNetns(b.ns, func() (err error) {
		if l, err = net.Listen("tcp4", "0.0.0.0:7000"); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp4", "0.0.0.0:7000")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	t.Cleanup(func() { l.Close(); pc.Close(); <-done; <-done })
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(tag))
			c.Close()
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(tag), from)
		}
	}()
}

// talk sends one TCP connection and one UDP datagram from b (from the
// local address src when valid) to dst:7000 and returns what came back
// on each ("" for nothing within the bound).
func (b *box) talk(t *testing.T, dst, src netip.Addr) (tcp, udp string) {
	t.Helper()
	err := point.InNetns(b.ns, func() error {
		d := net.Dialer{Timeout: 2 * time.Second}
		ud := net.Dialer{}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
			ud.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if c, err := d.DialContext(ctx, "tcp4", netip.AddrPortFrom(dst, 7000).String()); err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 64)
			n, _ := c.Read(buf)
			tcp = string(buf[:n])
			c.Close()
		}
		c, err := ud.Dial("udp4", netip.AddrPortFrom(dst, 7000).String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		// A datagram can be lost: ask a few times within the bound.
		for range 4 {
			_, _ = c.Write([]byte("?"))
			c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			if n, err := c.Read(buf); err == nil {
				udp = string(buf[:n])
				return nil
			} else if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
				return nil // refused: nothing there for us
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tcp, udp
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestGroupForwardsBetweenMembersOnly: members of one group reach each
// other on TCP and UDP; a sandbox of another group, an ungrouped attached
// sandbox and one that takes a member's address reach nobody; a member
// that leaves is unreachable.
func TestGroupForwardsBetweenMembersOnly(t *testing.T) {
	before := egresstest.Links(t)
	p, err := point.New(point.Options{Resolve: egresstest.Resolve()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, b, c, d := newBox(t), newBox(t), newBox(t), newBox(t)
	join := func(id string, x *box, group string) netip.Addr {
		addr, err := p.JoinGroup(id, x.path, group)
		if err != nil {
			t.Fatalf("join %s: %v", id, err)
		}
		return addr
	}
	aAddr, bAddr := join("sbx-a", a, "g1"), join("sbx-b", b, "g1")
	cAddr := join("sbx-c", c, "g2")
	if _, err := p.Attach("sbx-d", d.path, egress.Policy{Mode: egress.ModeAll}); err != nil {
		t.Fatal(err)
	}
	if again := join("sbx-a", a, "g1"); again != aAddr {
		t.Errorf("joining again: %s, first %s", again, aAddr)
	}
	if _, err := p.JoinGroup("sbx-a", a.path, "g2"); err == nil {
		t.Error("joined a second group")
	}
	if got, ok := p.Address("sbx-b"); !ok || got != bAddr {
		t.Errorf("Address: %s %v, want %s", got, ok, bAddr)
	}
	a.serve(t, "a")
	b.serve(t, "b")
	c.serve(t, "c")

	for _, tc := range []struct {
		name    string
		from    *box
		to, src netip.Addr
		want    string
	}{
		{"a→b", a, bAddr, netip.Addr{}, "b"},
		{"b→a", b, aAddr, netip.Addr{}, "a"},
		{"c→a (another group)", c, aAddr, netip.Addr{}, ""},
		{"a→c (another group)", a, cAddr, netip.Addr{}, ""},
		{"d→a (no group, policy all)", d, aAddr, netip.Addr{}, ""},
	} {
		tcp, udp := tc.from.talk(t, tc.to, tc.src)
		if tcp != tc.want || udp != tc.want {
			t.Errorf("%s: tcp %q udp %q, want %q", tc.name, tcp, udp, tc.want)
		}
	}

	// c takes b's address (it is root in its namespace) and speaks as b:
	// the router drops what does not come from b's own veth.
	if err := point.InNetns(c.ns, func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: bAddr.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	if tcp, udp := c.talk(t, aAddr, bAddr); tcp != "" || udp != "" {
		t.Errorf("c as b reached a: tcp %q udp %q", tcp, udp)
	}

	// b leaves: a no longer reaches it, nor b a.
	p.Detach("sbx-b")
	if tcp, udp := a.talk(t, bAddr, netip.Addr{}); tcp != "" || udp != "" {
		t.Errorf("a reached b after it left: %q %q", tcp, udp)
	}
	// A new member of g1 gets a fresh pair with a.
	e := newBox(t)
	eAddr := join("sbx-e", e, "g1")
	e.serve(t, "e")
	if tcp, udp := a.talk(t, eAddr, netip.Addr{}); tcp != "e" || udp != "e" {
		t.Errorf("a→e: %q %q", tcp, udp)
	}
	p.Close()
	if added := egresstest.NewLinks(before, egresstest.Links(t)); len(added) > 0 {
		t.Errorf("links added to the host: %v", added)
	}
}
