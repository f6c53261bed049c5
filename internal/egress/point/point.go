// Package point enforces egress policies (package egress): a Point is a
// network namespace of the gateway's own (the router) with a veth into
// each attached sandbox's namespace, nftables rules that send every packet
// from a sandbox to the Point's DNS server or TCP proxy or drop it, and
// those servers, which answer and admit only what the sandbox's policy
// allows and dial from the gateway's side.
package point

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/egress"
)

// DefaultPool is where sandboxes' addresses come from: the shared address
// space, which never routes anywhere from the router namespace.
var DefaultPool = netip.MustParsePrefix("100.64.0.0/10")

// Options configure a Point.
type Options struct {
	// Resolve are static answers the DNS gives before asking upstream
	// (tests, air-gapped deployments). Keys are lower case names.
	Resolve map[string][]netip.Addr
	// EgressNetns is a network namespace file (/proc/PID/ns/net) from which
	// admitted connections are dialled; "" is the gateway's own.
	EgressNetns string
	// Pool is where per-sandbox /30s come from; zero: DefaultPool.
	Pool       netip.Prefix
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Point is the egress point: a network namespace of its own (the router)
// holding one veth per attached sandbox, nftables rules that turn every
// packet from a sandbox into a connection to the Point's proxy or a query
// to its DNS (or drop it), and those two servers. It is built lazily by the
// first Attach and gone with Close (nothing is left in the host's
// namespace). Safe for concurrent use.
type Point struct {
	opts   Options
	egress netns.NsHandle // -1: dial from the gateway's own namespace

	mu       sync.Mutex
	router   netns.NsHandle // guarded by mu; -1 until the first Attach
	closed   bool
	slots    map[int]string         // slot → sandbox id
	attached map[string]*attachment // by sandbox id
	eng      *engine
	sockets  *socketMaker // egress namespace's sockets; nil when egress < 0 or not started
	// routerSockets are the router namespace's, for published ports
	// (publish.go); nil until the first Publish.
	routerSockets *socketMaker
	servers       []*dns.Server
	closers       []io.Closer // the servers' sockets
}

type attachment struct {
	slot  int
	m     *member
	group string // "" when in none (group.go)
	// published are its ports' listeners (publish.go), guarded by Point.mu;
	// ctx ends them and their connections (detach, Close).
	published map[uint16]net.Listener
	ctx       context.Context
	cancel    context.CancelFunc
}

// New checks opts and returns a Point that has built nothing yet.
func New(opts Options) (*Point, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if !opts.Pool.IsValid() {
		opts.Pool = DefaultPool
	}
	if !opts.Pool.Addr().Is4() || opts.Pool.Bits() > 28 {
		return nil, fmt.Errorf("egress: pool %s: want an IPv4 prefix of /28 or wider", opts.Pool)
	}
	p := &Point{opts: opts, egress: -1, router: -1, slots: map[int]string{}, attached: map[string]*attachment{}}
	if opts.EgressNetns != "" {
		h, err := netns.GetFromPath(opts.EgressNetns)
		if err != nil {
			return nil, fmt.Errorf("egress: netns %s: %w", opts.EgressNetns, err)
		}
		p.egress = h
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.eng = &engine{
		log: opts.Logger, metrics: newMetrics(opts.Registerer), static: opts.Resolve,
		lookup: hostLookup, socket: p.socket, origDst: originalDst, pool: opts.Pool,
		members: map[netip.Addr]*member{}, ctx: ctx, cancel: cancel,
	}
	return p, nil
}

// InNetns runs f on a fresh OS thread switched into ns. Sockets f creates
// stay in ns.
func InNetns(ns netns.NsHandle, f func() error) error {
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return err
		}
		return f()
	})
}

// onThread runs f on a fresh locked OS thread, which it may switch to
// another network namespace. The thread is returned to the runtime only if
// switching it back succeeds; otherwise it dies with its goroutine, so no
// goroutine ever runs in the wrong namespace.
func onThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		ferr := f()
		if err := netns.Set(orig); err == nil {
			runtime.UnlockOSThread()
		} else if ferr == nil {
			ferr = err
		}
		errc <- ferr
	}()
	return <-errc
}

// socket makes an unconnected TCP socket in the egress namespace: one
// made ahead by the socket maker, or, when the egress namespace is the
// gateway's own, a fresh one (unlocked threads are in the gateway's).
func (p *Point) socket(ctx context.Context) (int, error) {
	if p.sockets != nil {
		return p.sockets.get(ctx)
	}
	return newTCPSocket()
}

// originalDst is where a connection redirected by nftables was going
// (SO_ORIGINAL_DST, from conntrack).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// struct sockaddr_in fits the 16 bytes of an ipv6_mreq.
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := mreq.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	})
	if err == nil {
		err = serr
	}
	return ap, err
}

// start builds the router namespace, its rules and the servers. Called
// with p.mu held.
func (p *Point) start() error {
	var dnsUDP net.PacketConn
	var dnsTCP, proxy net.Listener
	var router netns.NsHandle = -1
	// The router namespace is made by unsharing a locked thread, which is
	// then switched back; the handle keeps the namespace alive.
	err := onThread(func() error {
		var err error
		if router, err = netns.New(); err != nil {
			return fmt.Errorf("new netns: %w", err)
		}
		if err = setupRouter(); err == nil {
			proxy, err = net.Listen("tcp4", "0.0.0.0:0")
		}
		if err == nil {
			dnsTCP, err = net.Listen("tcp4", "0.0.0.0:0")
		}
		if err == nil {
			dnsUDP, err = net.ListenPacket("udp4", fmt.Sprintf("0.0.0.0:%d", dnsTCP.Addr().(*net.TCPAddr).Port))
		}
		return err
	})
	if err == nil {
		err = installRules(router, proxy.Addr().(*net.TCPAddr).Port, dnsTCP.Addr().(*net.TCPAddr).Port)
	}
	if err != nil {
		if proxy != nil {
			proxy.Close()
		}
		if dnsTCP != nil {
			dnsTCP.Close()
		}
		if dnsUDP != nil {
			dnsUDP.Close()
		}
		if router >= 0 {
			router.Close()
		}
		return fmt.Errorf("egress: router namespace: %w", err)
	}
	p.router = router
	if p.egress >= 0 {
		p.sockets = startSocketMaker(p.egress)
	}
	p.closers = []io.Closer{proxy, dnsTCP, dnsUDP}
	p.servers = p.eng.serve(proxy, dnsTCP, dnsUDP)
	return nil
}

// setupRouter runs on a thread inside the new router namespace.
func setupRouter() error {
	for path, v := range map[string]string{
		// Forwarding is on for group traffic (group.go); the forward
		// chain drops everything else, so other packets end in a local
		// socket or nowhere.
		"/proc/sys/net/ipv4/ip_forward":                  "1",
		"/proc/sys/net/ipv4/conf/all/send_redirects":     "0",
		"/proc/sys/net/ipv4/conf/default/send_redirects": "0",
		// Sandboxes have IPv4 only; no link-local v6 either.
		"/proc/sys/net/ipv6/conf/all/disable_ipv6":     "1",
		"/proc/sys/net/ipv6/conf/default/disable_ipv6": "1",
	} {
		if err := os.WriteFile(path, []byte(v), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(lo)
}

// Attach gives sandbox id, whose network namespace is the file nsPath, its
// way out under pol: a veth into the router namespace named eth0 inside,
// an address from the pool and a default route through it. It returns the
// sandbox's nameserver address (its resolv.conf must point there, or
// anywhere off loopback: all port 53 traffic reaches the Point's DNS).
// Attaching an attached sandbox only sets its policy.
func (p *Point) Attach(id, nsPath string, pol egress.Policy) (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.attached[id]; ok && !p.closed {
		a.m.policy.Store(&pol)
		return p.routerAddr(a.slot), nil
	}
	a, err := p.attach(id, nsPath, pol)
	if err != nil {
		return netip.Addr{}, err
	}
	return p.routerAddr(a.slot), nil
}

// attach plumbs a sandbox that is not attached. Called with p.mu held.
func (p *Point) attach(id, nsPath string, pol egress.Policy) (*attachment, error) {
	if p.closed {
		return nil, errors.New("egress: closed")
	}
	if p.router < 0 {
		if err := p.start(); err != nil {
			return nil, err
		}
	}
	slot := 0
	for p.slots[slot] != "" {
		slot++
	}
	if (slot+1)*4 > 1<<(32-p.opts.Pool.Bits()) {
		return nil, errors.New("egress: address pool exhausted")
	}
	sbns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("egress: sandbox netns: %w", err)
	}
	defer sbns.Close()
	rAddr, sAddr := p.routerAddr(slot), p.routerAddr(slot).Next()
	if err := plumb(p.router, sbns, vethName(slot), rAddr, sAddr); err != nil {
		return nil, fmt.Errorf("egress: attach %s: %w", id, err)
	}
	m := &member{id: id, addr: sAddr}
	m.policy.Store(&pol)
	a := &attachment{slot: slot, m: m}
	a.ctx, a.cancel = context.WithCancel(p.eng.ctx)
	p.slots[slot] = id
	p.attached[id] = a
	p.eng.mu.Lock()
	p.eng.members[sAddr] = m
	p.eng.mu.Unlock()
	return a, nil
}

// routerAddr is the router's end of slot's /30 (the sandbox's is next).
func (p *Point) routerAddr(slot int) netip.Addr {
	b := p.opts.Pool.Masked().Addr().As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(slot)*4 + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// vethMTU is the MTU of both ends of a sandbox's veth pair: the most a
// veth takes.
const vethMTU = 65535

func vethName(slot int) string { return fmt.Sprintf("sg%x", slot) }

// plumb makes the veth pair: name in the router namespace with rAddr/30,
// its peer moved into sbns as eth0 with sAddr/30 and a default route.
func plumb(router, sbns netns.NsHandle, name string, rAddr, sAddr netip.Addr) error {
	rh, err := netlink.NewHandleAt(router)
	if err != nil {
		return err
	}
	defer rh.Close()
	sh, err := netlink.NewHandleAt(sbns)
	if err != nil {
		return err
	}
	defer sh.Close()
	peer := name + "p"
	// Every packet on the pair ends in a socket of the router namespace, so
	// its MTU need fit no wire: the largest, for fewer segments.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: vethMTU}, PeerName: peer, PeerNamespace: netlink.NsFd(int(sbns))}
	if err := rh.LinkAdd(veth); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = rh.LinkDel(veth)
		}
	}()
	addr := func(h *netlink.Handle, link string, a netip.Addr) (netlink.Link, error) {
		l, err := h.LinkByName(link)
		if err != nil {
			return nil, err
		}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(30, 32)}}); err != nil {
			return nil, err
		}
		return l, h.LinkSetUp(l)
	}
	if _, err := addr(rh, name, rAddr); err != nil {
		return fmt.Errorf("router end: %w", err)
	}
	pl, err := sh.LinkByName(peer)
	if err != nil {
		return err
	}
	// An eth0 already there is a former point's (a gateway restarted: the
	// kernel tears the old router namespace down, and with it the old
	// pair, some time after its last holder exits) or the sandbox's own
	// making. Either way this pair replaces it.
	if old, err := sh.LinkByName("eth0"); err == nil {
		if err := sh.LinkDel(old); err != nil {
			return fmt.Errorf("remove the eth0 there: %w", err)
		}
	}
	if err := sh.LinkSetName(pl, "eth0"); err != nil {
		return fmt.Errorf("rename: %w", err)
	}
	if lo, err := sh.LinkByName("lo"); err == nil {
		_ = sh.LinkSetUp(lo)
	}
	sl, err := addr(sh, "eth0", sAddr)
	if err != nil {
		return fmt.Errorf("sandbox end: %w", err)
	}
	if err := sh.RouteAdd(&netlink.Route{LinkIndex: sl.Attrs().Index, Gw: rAddr.AsSlice()}); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	ok = true
	return nil
}

// SetPolicy replaces an attached sandbox's policy; connections and
// questions from then on are judged by it (open connections stay).
func (p *Point) SetPolicy(id string, pol egress.Policy) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.attached[id]
	if ok {
		a.m.policy.Store(&pol)
	}
	return ok
}

// Attached reports whether id has a veth into the router.
func (p *Point) Attached(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.attached[id]
	return ok
}

// Stats are id's connection counts (zero when not attached).
func (p *Point) Stats(id string) egress.Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.attached[id]
	if !ok {
		return egress.Stats{}
	}
	return egress.Stats{Allowed: a.m.allowed.Load(), Denied: a.m.denied.Load()}
}

// Detach removes id's veth (its namespace loses eth0) and forgets it. A
// sandbox that is not attached is not an error.
func (p *Point) Detach(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.attached[id]; ok {
		p.detach(id, a)
	}
}

// detach undoes attach. Called with p.mu held.
func (p *Point) detach(id string, a *attachment) {
	p.leave(id, a)
	a.cancel()
	delete(p.attached, id)
	delete(p.slots, a.slot)
	p.eng.mu.Lock()
	delete(p.eng.members, a.m.addr)
	p.eng.mu.Unlock()
	if rh, err := netlink.NewHandleAt(p.router); err == nil {
		if l, err := rh.LinkByName(vethName(a.slot)); err == nil {
			_ = rh.LinkDel(l)
		}
		rh.Close()
	}
}

// Close stops the servers, ends every proxied connection and lets the
// router namespace go (with it every veth: attached sandboxes lose their
// eth0). It waits for every goroutine it started.
func (p *Point) Close() error {
	p.mu.Lock()
	p.closed = true
	servers, closers := p.servers, p.closers
	p.mu.Unlock()
	for _, s := range servers {
		_ = s.Shutdown()
	}
	// Closing the sockets too ends a server that had not started serving
	// when Shutdown came.
	for _, c := range closers {
		_ = c.Close()
	}
	p.eng.cancel()
	p.eng.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sm := range []**socketMaker{&p.sockets, &p.routerSockets} {
		if *sm != nil {
			(*sm).close()
			*sm = nil
		}
	}
	if p.router >= 0 {
		p.router.Close()
		p.router = -1
	}
	if p.egress >= 0 {
		p.egress.Close()
		p.egress = -1
	}
	return nil
}

// ParseResolve reads static answers written name=addr,... (a name may
// repeat; names are matched in lower case, without a trailing dot).
func ParseResolve(v string) (map[string][]netip.Addr, error) {
	out := map[string][]netip.Addr{}
	for _, kv := range strings.Split(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, addr, ok := strings.Cut(kv, "=")
		a, err := netip.ParseAddr(strings.TrimSpace(addr))
		if !ok || err != nil {
			return nil, fmt.Errorf("%q: want name=address", kv)
		}
		name = egress.NormName(strings.TrimSpace(name))
		out[name] = append(out[name], a)
	}
	return out, nil
}

// FormatResolve writes static answers as ParseResolve reads them, names
// in order.
func FormatResolve(r map[string][]netip.Addr) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(r)) {
		for _, a := range r[name] {
			parts = append(parts, name+"="+a.String())
		}
	}
	return strings.Join(parts, ",")
}
