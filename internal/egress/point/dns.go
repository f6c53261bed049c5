package point

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/sandgate/sandgate/internal/egress"
)

// dnsTTL is the TTL of every answer: short, so a policy change or a moved
// name is seen soon.
const dnsTTL = 30

// ServeDNS answers one question from a member: NXDOMAIN for a name its
// policy does not allow (and for any question from an unknown source),
// otherwise the name's IPv4 addresses (static answers first, else the
// host's resolver), remembered for the proxy. Sandboxes have no IPv6 route,
// so AAAA and other types get an empty answer.
func (e *engine) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(q)
	resp.RecursionAvailable = true
	defer func() { _ = w.WriteMsg(resp) }()
	if len(q.Question) != 1 {
		resp.Rcode = dns.RcodeFormatError
		return
	}
	question := q.Question[0]
	name := egress.NormName(question.Name)
	var m *member
	if ap, err := netip.ParseAddrPort(w.RemoteAddr().String()); err == nil {
		m = e.member(ap.Addr())
	}
	if m == nil || !m.policy.Load().AllowsName(name) {
		e.metrics.queries.WithLabelValues("refused").Inc()
		resp.Rcode = dns.RcodeNameError
		return
	}
	if question.Qtype != dns.TypeA {
		e.metrics.queries.WithLabelValues("answered").Inc()
		return
	}
	addrs, ok := e.static[name]
	if !ok {
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		var err error
		if addrs, err = e.lookup(ctx, name); err != nil {
			e.metrics.queries.WithLabelValues("failed").Inc()
			resp.Rcode = dns.RcodeServerFailure
			if dnsErr, ok := err.(*net.DNSError); ok && dnsErr.IsNotFound {
				resp.Rcode = dns.RcodeNameError
			}
			return
		}
	}
	var v4 []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			v4 = append(v4, a)
			resp.Answer = append(resp.Answer, &dns.A{
				Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsTTL},
				A:   a.AsSlice(),
			})
		}
	}
	m.remember(name, v4)
	e.metrics.queries.WithLabelValues("answered").Inc()
}

// hostLookup resolves name with the gateway's own resolver.
func hostLookup(ctx context.Context, name string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip4", name)
}
