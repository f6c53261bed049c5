package point

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandgate/sandgate/internal/egress"
)

// maxNames bounds how many addresses the DNS remembers per sandbox; past it
// the memory starts over (a connection to an address answered before that
// is then judged by CIDR rules only until the name is looked up again).
const maxNames = 4096

// member is one attached sandbox as the DNS server and the proxy see it.
type member struct {
	id     string
	addr   netip.Addr // its address in the pool: how its packets are told apart
	policy atomic.Pointer[egress.Policy]

	mu    sync.Mutex
	names map[netip.Addr][]string // guarded by mu: which allowed names the DNS answered with an address

	allowed, denied atomic.Int64
}

func (m *member) remember(name string, addrs []netip.Addr) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.names == nil || len(m.names) >= maxNames {
		m.names = make(map[netip.Addr][]string)
	}
	for _, a := range addrs {
		if ns := m.names[a]; !containsStr(ns, name) {
			m.names[a] = append(ns, name)
		}
	}
}

func (m *member) namesFor(a netip.Addr) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.names[a]...)
}

func containsStr(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// metrics are the egress point's Prometheus collectors. Labels stay
// bounded: per-sandbox counts are in egress.Stats, not in labels.
type metrics struct {
	conns           *prometheus.CounterVec // result=allowed|denied
	allowed, denied prometheus.Counter     // conns' two, looked up once
	queries         *prometheus.CounterVec // result=answered|refused|failed
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_egress_connections_total",
			Help: "TCP connections sandboxes opened through the egress point, by result.",
		}, []string{"result"}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandgate_egress_dns_queries_total",
			Help: "DNS questions sandboxes asked the egress point, by result.",
		}, []string{"result"}),
	}
	m.allowed, m.denied = m.conns.WithLabelValues("allowed"), m.conns.WithLabelValues("denied")
	if reg != nil {
		reg.MustRegister(m.conns, m.queries)
	}
	return m
}

// engine is the namespace-agnostic half of a Point: the DNS handler and
// the TCP proxy, serving whatever listeners it is given. Members are found
// by the source address of what they send.
type engine struct {
	log     *slog.Logger
	metrics *metrics
	static  map[string][]netip.Addr // names answered before upstream
	lookup  func(ctx context.Context, name string) ([]netip.Addr, error)
	// socket makes an unconnected non-blocking TCP socket in the
	// namespace admitted connections are dialled from.
	socket func(ctx context.Context) (int, error)
	// origDst tells where a redirected connection was going.
	origDst func(c net.Conn) (netip.AddrPort, error)
	// pool is never a destination: it is the sandboxes' side of the point.
	pool netip.Prefix

	// only, when set, is the one member whatever the source (a pod's
	// point, pod.go); members is then empty.
	only *member

	mu      sync.RWMutex
	members map[netip.Addr]*member // guarded by mu

	ctx    context.Context // cancelled by close: ends every proxied connection
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine serving a connection or a listener
}

func (e *engine) member(src netip.Addr) *member {
	if e.only != nil {
		return e.only
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.members[src.Unmap()]
}

// serve starts the proxy on proxy and the DNS server on dnsTCP and
// dnsUDP, until the listeners are closed (and the servers, returned, shut
// down); e.wg counts their goroutines.
func (e *engine) serve(proxy, dnsTCP net.Listener, dnsUDP net.PacketConn) []*dns.Server {
	servers := []*dns.Server{{PacketConn: dnsUDP, Handler: e}, {Listener: dnsTCP, Handler: e}}
	e.wg.Add(1 + len(servers))
	go e.serveTCP(proxy)
	for _, s := range servers {
		go func() {
			defer e.wg.Done()
			_ = s.ActivateAndServe()
		}()
	}
	return servers
}
