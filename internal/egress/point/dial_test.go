package point_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/vishvananda/netlink"
)

// TestDeniedNameSendsNothingUpstream: the point connects to an admitted
// address while it reads the client's first bytes; when the server name
// there is then denied (an SNI or Host the policy does not allow, sent to
// an allowed name's address), not one byte of the client's reaches the
// destination. A connection whose name is allowed does deliver them (the
// listener sees bytes at all).
func TestDeniedNameSendsNothingUpstream(t *testing.T) {
	up := newBox(t) // the destination's namespace, the point's egress
	h, err := netlink.NewHandleAt(up.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err == nil {
		err = h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: egresstest.A.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}
	if err != nil {
		t.Fatal(err)
	}
	// A listener on 80 and 443 that records what each connection sent.
	type result struct {
		n    int64
		head string
	}
	var mu sync.Mutex
	var accepted int
	var results []result
	var wg sync.WaitGroup
	var lns []net.Listener
	err = point.InNetns(up.ns, func() error {
		for _, port := range []int{80, 443} {
			ln, err := net.Listen("tcp4", fmt.Sprintf("%s:%d", egresstest.A, port))
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				accepted++
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					var b strings.Builder
					n, _ := io.Copy(&b, c)
					mu.Lock()
					results = append(results, result{n, b.String()})
					mu.Unlock()
				}()
			}
		}()
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		wg.Wait()
	})

	p, err := point.New(point.Options{Resolve: map[string][]netip.Addr{"a.test": {egresstest.A}}, EgressNetns: up.path})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	sb := newBox(t)
	if _, err := p.Attach("sbx-peek", sb.path, mustRules(t, []string{"a.test"}, nil)); err != nil {
		t.Fatal(err)
	}
	if rc, addrs := sb.resolve(t, "a.test"); rc != 0 || len(addrs) != 1 {
		t.Fatalf("a.test: rcode %d %v", rc, addrs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	send := func(port int, f func(c net.Conn)) {
		c, err := sb.dial(ctx, fmt.Sprintf("%s:%d", egresstest.A, port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		f(c)
	}
	// Denied: SNI b.test and Host b.test at a.test's address. The client
	// is refused (a reset) and the destination got nothing.
	send(443, func(c net.Conn) {
		if err := tls.Client(c, &tls.Config{ServerName: "b.test", InsecureSkipVerify: true}).Handshake(); err == nil {
			t.Error("TLS handshake with SNI b.test completed")
		}
	})
	send(80, func(c net.Conn) {
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
		if n, err := io.Copy(io.Discard, c); err == nil && n > 0 {
			t.Errorf("Host b.test: %d bytes back", n)
		}
	})
	// Allowed: Host a.test arrives whole.
	const allowed = "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n"
	send(80, func(c net.Conn) {
		fmt.Fprint(c, allowed)
		_ = c.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, c)
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		rs, n := append([]result(nil), results...), accepted
		mu.Unlock()
		done := len(rs) == n && slices.ContainsFunc(rs, func(r result) bool { return r.head == allowed })
		if done {
			for _, r := range rs {
				if r.n > 0 && r.head != allowed {
					t.Errorf("destination received %d bytes of a denied connection (%.40q)", r.n, r.head)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("destination: %d accepted, results %+v", n, rs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
