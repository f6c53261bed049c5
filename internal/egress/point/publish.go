package point

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// Published ports. An attached sandbox has no network but its veth, so a
// port it serves is reached from the gateway's side: Publish makes a
// listener on 127.0.0.1 at a random port in the gateway's namespace (as
// docker publishes a port) and joins each connection it accepts to one
// dialled from the router namespace to the sandbox's address. This is no
// way out: the sandbox only answers connections it is given, and the
// router's rules are unchanged (a reply belongs to a connection the router
// made, so the redirect never sees it).

// Publish returns the address of a listener on 127.0.0.1 whose
// connections reach port of attached sandbox id: one listener per port,
// kept until id is detached or the point closed (its connections end
// then too). An error when id is not attached.
func (p *Point) Publish(id string, port uint16) (netip.AddrPort, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.attached[id]
	if !ok || p.closed {
		return netip.AddrPort{}, fmt.Errorf("egress: publish port %d of %s: not attached", port, id)
	}
	if ln, ok := a.published[port]; ok {
		return ln.Addr().(*net.TCPAddr).AddrPort(), nil
	}
	if p.routerSockets == nil {
		p.routerSockets = startSocketMaker(p.router)
	}
	// This goroutine's thread is in the gateway's namespace: only locked
	// threads (onThread, the socket makers) ever leave it.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("egress: publish port %d of %s: %w", port, id, err)
	}
	if a.published == nil {
		a.published = map[uint16]net.Listener{}
	}
	a.published[port] = ln
	p.eng.wg.Add(1)
	go p.servePublished(a.ctx, ln, netip.AddrPortFrom(a.m.addr, port), p.routerSockets)
	return ln.Addr().(*net.TCPAddr).AddrPort(), nil
}

// servePublished accepts on ln until ctx ends (the sandbox's detach or the
// point's close) and joins every connection to dst, dialled from the
// router namespace with a socket from sockets.
func (p *Point) servePublished(ctx context.Context, ln net.Listener, dst netip.AddrPort, sockets *socketMaker) {
	defer p.eng.wg.Done()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.eng.wg.Add(1)
		go func() {
			defer p.eng.wg.Done()
			relayIn(ctx, c, dst, sockets)
		}()
	}
}

// relayIn joins c to a connection to dst from the router namespace; a
// sandbox that does not answer gets c reset, as a closed port would.
func relayIn(ctx context.Context, c net.Conn, dst netip.AddrPort, sockets *socketMaker) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	dctx, dcancel := context.WithTimeout(ctx, dialTimeout)
	defer dcancel()
	fd, err := sockets.get(dctx)
	var up net.Conn
	if err == nil {
		var pending *connecting
		if pending, err = startConnect(fd, dst); err == nil {
			up, err = pending.finish(dctx)
		}
	}
	if err != nil {
		refuse(c)
		return
	}
	join(ctx, c, up, nil)
}
