package point

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/sandgate/sandgate/internal/egress"
)

const (
	// peekTimeout bounds the wait for a client's first bytes (ClientHello,
	// request head) when its server name must be checked.
	peekTimeout = 10 * time.Second
	// peekMax bounds what is read ahead of the decision.
	peekMax = 16 << 10
	// dialTimeout bounds the connection to an admitted destination.
	dialTimeout = 30 * time.Second
)

// serveTCP accepts redirected connections from ln until it is closed.
func (e *engine) serveTCP(ln net.Listener) {
	defer e.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.proxy(c)
		}()
	}
}

// proxy decides one connection and, when admitted, joins it to its
// destination until either side is done or the engine closes.
func (e *engine) proxy(c net.Conn) {
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()

	var m *member
	if ra, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		m = e.member(ra.AddrPort().Addr())
	}
	if m == nil {
		refuse(c)
		return
	}
	dst, err := e.origDst(c)
	if err != nil {
		e.log.Warn("egress: no original destination", "sandbox", m.id, "err", err)
		refuse(c)
		return
	}
	pol := m.policy.Load()
	adm := egress.Admission{Reason: egress.ReasonReserved}
	if !e.pool.Contains(dst.Addr()) {
		adm = pol.Admit(dst.Addr(), m.namesFor(dst.Addr()))
	}
	// An admitted address is connected to at once, while the client's
	// first bytes are read and its server name checked: the two overlap
	// (the handshake is waited for on a goroutine of its own). A
	// connection the name then denies is closed before any byte of the
	// client's reaches the destination (the address was admitted already).
	dctx, dcancel := context.WithTimeout(ctx, dialTimeout)
	defer dcancel()
	peek := adm.Allowed && (adm.ByName || pol.DeniesNames())
	var dialing chan dialed
	if adm.Allowed {
		dialing = e.dial(dctx, dst, peek)
	}
	var head []byte
	if peek {
		var name string
		head, name = peekServerName(c, dst.Port())
		adm = pol.CheckServerName(adm, name)
	}
	if !adm.Allowed {
		if dialing != nil {
			dcancel()
			if d := <-dialing; d.conn != nil {
				refuse(d.conn)
			}
		}
		m.denied.Add(1)
		e.metrics.denied.Inc()
		e.log.Info("egress: connection denied", "sandbox", m.id, "target", dst.String(), "reason", adm.Reason)
		refuse(c)
		return
	}
	m.allowed.Add(1)
	e.metrics.allowed.Inc()
	d := <-dialing
	dcancel()
	if d.err != nil {
		e.log.Debug("egress: dial", "sandbox", m.id, "target", dst.String(), "err", d.err)
		refuse(c)
		return
	}
	join(ctx, c, d.conn, head)
}

// dialed is a connection to an admitted destination, or why there is none.
type dialed struct {
	conn net.Conn
	err  error
}

// dial connects to dst from the egress namespace until ctx ends. The
// result is sent on the returned channel (buffered), which the caller
// must receive from: at once, or, with async, after what it does while a
// goroutine connects (the socket, the connect and the wait for the
// handshake are all on it).
func (e *engine) dial(ctx context.Context, dst netip.AddrPort, async bool) chan dialed {
	ch := make(chan dialed, 1)
	connect := func() {
		var d dialed
		fd, err := e.socket(ctx)
		var pending *connecting
		if err == nil {
			pending, err = startConnect(fd, dst)
		}
		if err == nil {
			d.conn, err = pending.finish(ctx)
		}
		d.err = err
		ch <- d
	}
	if async {
		go connect()
	} else {
		connect()
	}
	return ch
}

// join writes head to up, then copies between c and up both ways until
// both directions are done or ctx ends; it closes up (c stays the
// caller's). Both are *net.TCPConn, so io.Copy splices in the kernel.
func join(ctx context.Context, c, up net.Conn, head []byte) {
	defer up.Close()
	stopUp := context.AfterFunc(ctx, func() { up.Close() })
	defer stopUp()
	if len(head) > 0 {
		if _, err := up.Write(head); err != nil {
			return
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, c)
		closeWrite(up)
	}()
	_, _ = io.Copy(c, up)
	closeWrite(c)
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
}

// refuse closes c with a reset, as a closed port would.
func refuse(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// peekServerName reads the start of what the client sends to port 443 (a
// TLS ClientHello) or 80 (an HTTP request head) and returns the bytes read,
// to be replayed, and the server name found ("" when none: other ports,
// other protocols, a client that sends nothing in time).
func peekServerName(c net.Conn, port uint16) ([]byte, string) {
	if port != 443 && port != 80 {
		return nil, ""
	}
	_ = c.SetReadDeadline(time.Now().Add(peekTimeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	var rec bytes.Buffer
	r := io.TeeReader(io.LimitReader(c, peekMax), &rec)
	if port == 443 {
		sni := clientHelloSNI(r)
		return rec.Bytes(), sni
	}
	req, err := http.ReadRequest(bufio.NewReader(r))
	if err != nil {
		return rec.Bytes(), ""
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return rec.Bytes(), host
}

var errHelloRead = errors.New("client hello read")

// clientHelloSNI parses a TLS ClientHello from r with crypto/tls, stopping
// the handshake as soon as the hello is parsed.
func clientHelloSNI(r io.Reader) string {
	var sni string
	_ = tls.Server(readOnlyConn{r: r}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			sni = h.ServerName
			return nil, errHelloRead
		},
	}).Handshake()
	return sni
}

// readOnlyConn lets crypto/tls read a ClientHello and nothing more: its
// writes (an alert) go nowhere.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return nil }
func (readOnlyConn) RemoteAddr() net.Addr             { return nil }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
