package dockertest

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Proxy is a unix-socket proxy in front of the real daemon socket. Giving
// a provider (or a gateway, --docker-host) Host() instead of the daemon's
// address lets a test take the daemon away from that one user: Cut closes
// every connection and refuses new ones, Restore accepts again. Other
// users of the shared daemon notice nothing.
type Proxy struct {
	path, target string

	mu    sync.Mutex
	ln    net.Listener // nil while cut
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // accept loop and connection pumps
}

// NewProxy starts a proxy to the default daemon socket (DOCKER_HOST when
// it is a unix socket, else /var/run/docker.sock) on a socket in a
// temporary directory. It is closed (Cut) when t ends. It does not check
// that a daemon answers: call Require for that.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	target := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); strings.HasPrefix(h, "unix://") {
		target = strings.TrimPrefix(h, "unix://")
	}
	// Unix socket paths are short (108 bytes); t.TempDir can be long.
	dir, err := os.MkdirTemp("", "sgdock-")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{path: filepath.Join(dir, "docker.sock"), target: target, conns: map[net.Conn]struct{}{}}
	p.Restore(t)
	t.Cleanup(func() {
		p.Cut()
		os.RemoveAll(dir)
	})
	return p
}

// Host is the proxy's address for client.WithHost or --docker-host.
func (p *Proxy) Host() string { return "unix://" + p.path }

// Restore starts accepting connections again (a no-op if not cut).
func (p *Proxy) Restore(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	os.Remove(p.path)
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
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

// Cut closes the listener and every proxied connection and waits for the
// pumps to end: the daemon is gone for whoever uses Host. Idempotent.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// pump joins c to a new connection to the daemon, passing half-closes on.
func (p *Proxy) pump(c net.Conn) {
	u, err := net.Dial("unix", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, u) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(u, c)
		u.(*net.UnixConn).CloseWrite()
	}()
	go func() {
		defer wg.Done()
		io.Copy(c, u)
		c.(*net.UnixConn).CloseWrite()
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
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	return true
}
