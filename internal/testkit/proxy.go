package testkit

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards connections to a target and lets a test take the target
// away from whoever dials the proxy, and only from them: Sever drops every
// open connection (a real drop, no close frame or FIN from the target),
// Cut also refuses new ones until Restore. It listens on loopback TCP or
// on a unix socket, like its target.
type Proxy struct {
	network, addr, target string
	idle                  time.Duration // > 0: cut a pair idle this long (NewIdleProxy)
	idleCuts              atomic.Int64

	mu    sync.Mutex
	ln    net.Listener      // nil while cut
	conns map[net.Conn]bool // open connections; true for the dialling side's
	wg    sync.WaitGroup    // accept loops and pumps
}

// NewProxy starts a proxy to target on network ("tcp": a free port on
// 127.0.0.1; "unix": a socket in a new temporary directory). It is cut and
// its pumps joined when t ends.
func NewProxy(t testing.TB, network, target string) *Proxy {
	t.Helper()
	p := &Proxy{network: network, target: target, conns: map[net.Conn]bool{}}
	p.listenOn(t)
	return p
}

// listenOn picks p's address on its network and starts it.
func (p *Proxy) listenOn(t testing.TB) {
	t.Helper()
	switch p.network {
	case "tcp":
		p.addr = "127.0.0.1:0"
	case "unix":
		// Unix socket paths are short (108 bytes); t.TempDir can be long.
		dir, err := os.MkdirTemp("", "sgproxy-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		p.addr = filepath.Join(dir, "proxy.sock")
	default:
		t.Fatalf("proxy: network %q, want tcp or unix", p.network)
	}
	p.Restore(t)
	t.Cleanup(p.Cut)
}

// NewIdleProxy is NewProxy with a load balancer's idle timeout: a
// connection on which no byte passed either way for idle is closed, both
// sides, as such proxies do to quiet long requests.
func NewIdleProxy(t testing.TB, network, target string, idle time.Duration) *Proxy {
	t.Helper()
	p := &Proxy{network: network, target: target, conns: map[net.Conn]bool{}, idle: idle}
	p.listenOn(t)
	return p
}

// IdleCuts is how many connections the idle timeout closed.
func (p *Proxy) IdleCuts() int { return int(p.idleCuts.Load()) }

// Addr is the address to dial instead of the target: host:port for tcp,
// the socket's path for unix. A tcp proxy keeps its port across Cut and
// Restore.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Restore accepts connections again after Cut (a no-op if not cut).
func (p *Proxy) Restore(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	if p.network == "unix" {
		os.Remove(p.addr)
	}
	ln, err := net.Listen(p.network, p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pump(c)
			}()
		}
	}()
}

// Sever closes every open connection, both sides, and returns how many
// client connections it closed. New connections are still accepted.
func (p *Proxy) Sever() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c, client := range p.conns {
		c.Close()
		if client {
			n++
		}
	}
	return n
}

// Cut stops accepting, severs every connection and waits until the pumps
// have ended: the target is gone for whoever uses Addr. Idempotent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.Sever()
	p.wg.Wait()
}

// pump joins c to a new connection to the target, passing half-closes on.
func (p *Proxy) pump(c net.Conn) {
	u, err := net.Dial(p.network, p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, u) {
		return
	}
	var from, to io.Reader = c, u
	if p.idle > 0 {
		a := &activity{d: p.idle}
		a.t = time.AfterFunc(p.idle, func() {
			p.idleCuts.Add(1)
			c.Close()
			u.Close()
		})
		defer a.t.Stop()
		from, to = &activeReader{c, a}, &activeReader{u, a}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(u, from)
		closeWrite(u)
	}()
	go func() {
		defer wg.Done()
		io.Copy(c, to)
		closeWrite(c)
	}()
	wg.Wait()
	c.Close()
	u.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// track registers a connection pair, or closes it if the proxy was cut
// meanwhile.
func (p *Proxy) track(c, u net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		c.Close()
		u.Close()
		return false
	}
	p.conns[c], p.conns[u] = true, false
	return true
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		c.Close()
	}
}

// activity is the idle timer of a connection pair: any byte either way
// restarts it.
type activity struct {
	mu sync.Mutex // orders the resets of the two directions
	t  *time.Timer
	d  time.Duration
}

// activeReader restarts its pair's idle timer on every byte read.
type activeReader struct {
	r io.Reader
	a *activity
}

func (r *activeReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if n > 0 {
		r.a.mu.Lock()
		r.a.t.Reset(r.a.d)
		r.a.mu.Unlock()
	}
	return n, err
}
