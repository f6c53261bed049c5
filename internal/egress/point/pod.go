package point

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/egress"
)

// A pod's egress point (Kubernetes, where no router namespace can be put
// in front of a pod: CNIs own its link) is the same engine run inside the
// pod's own network namespace, by a container of the pod that alone holds
// NET_ADMIN, for that one pod. Its nftables rules (table inet sandgate)
// turn what any other process of the pod sends into a connection to its
// proxy or a question to its DNS, or drop it:
//
//	out-nat (output, dstnat): its own sockets (they carry PodMark) and
//	        loopback go as they are, so do packets to the group's peers;
//	        TCP and UDP to port 53 → the DNS port, any other TCP → the
//	        proxy port (both on 127.0.0.1)
//	out     (output, policy drop): its own sockets, loopback, what out-nat
//	        redirected, and the peers only (UDP but DNS, ICMP, raw packets
//	        and IPv6 go nowhere)
//	in      (input, policy drop): loopback, replies, and the peers only
//
// A process without NET_ADMIN or NET_RAW can neither mark its sockets nor
// touch the rules, so root in the sandbox's container changing its
// routes, resolv.conf or addresses still reaches only those two sockets.
// The rules outlive the point's process: a point that dies leaves the pod
// with no way out (fail closed) until it is back.

// PodMark is the socket mark of a pod point's own connections (dialled
// destinations, upstream DNS): the one thing its rules let out.
const PodMark = 0x53470001

// Ports of a pod point's servers on 127.0.0.1, unless its options say.
const (
	DefaultPodProxyPort = 15001
	DefaultPodDNSPort   = 15053
)

// PodOptions configure a PodPoint.
type PodOptions struct {
	// Resolve are static answers the DNS gives before asking upstream.
	Resolve map[string][]netip.Addr
	// ProxyPort and DNSPort are the servers' ports on 127.0.0.1; zero:
	// DefaultPodProxyPort and DefaultPodDNSPort.
	ProxyPort, DNSPort int
	Logger             *slog.Logger
	Registerer         prometheus.Registerer
}

// PodPoint is the egress point of the pod whose network namespace the
// calling process is in. Safe for concurrent use.
type PodPoint struct {
	eng     *engine
	servers []*dns.Server
	closers []io.Closer
}

// StartPod starts the servers, then installs the rules (replacing those of
// a point that ran before: in one transaction, so the pod is never open),
// with pol as the policy and peers as the group's addresses. It needs
// CAP_NET_ADMIN in the namespace.
func StartPod(opts PodOptions, pol egress.Policy, peers []netip.Addr) (*PodPoint, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ProxyPort == 0 {
		opts.ProxyPort = DefaultPodProxyPort
	}
	if opts.DNSPort == 0 {
		opts.DNSPort = DefaultPodDNSPort
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{id: "pod"}
	m.policy.Store(&pol)
	upstream := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Control: markSocket}
		return d.DialContext(ctx, network, addr)
	}}
	p := &PodPoint{eng: &engine{
		log: opts.Logger, metrics: newMetrics(opts.Registerer), static: opts.Resolve,
		lookup: func(ctx context.Context, name string) ([]netip.Addr, error) {
			return upstream.LookupNetIP(ctx, "ip4", name)
		},
		socket: newMarkedSocket, origDst: originalDst,
		only: m, members: map[netip.Addr]*member{}, ctx: ctx, cancel: cancel,
	}}
	local := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
	var proxy, dnsTCP net.Listener
	var dnsUDP net.PacketConn
	proxy, err := net.Listen("tcp4", local(opts.ProxyPort))
	if err == nil {
		p.closers = append(p.closers, proxy)
		dnsTCP, err = net.Listen("tcp4", local(opts.DNSPort))
	}
	if err == nil {
		p.closers = append(p.closers, dnsTCP)
		dnsUDP, err = net.ListenPacket("udp4", local(opts.DNSPort))
	}
	if err == nil {
		p.closers = append(p.closers, dnsUDP)
		err = installPodRules(opts.ProxyPort, opts.DNSPort, peers)
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("egress: pod point: %w", err)
	}
	p.servers = p.eng.serve(proxy, dnsTCP, dnsUDP)
	return p, nil
}

// SetPolicy replaces the pod's policy: connections and questions from
// then on are judged by it (open connections stay).
func (p *PodPoint) SetPolicy(pol egress.Policy) { p.eng.only.policy.Store(&pol) }

// SetPeers replaces the addresses of the pod's group (they reach the pod,
// and it them, on every port and protocol).
func (p *PodPoint) SetPeers(peers []netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: "sandgate"}
	s, err := c.GetSetByName(t, peerSet)
	if err != nil {
		return fmt.Errorf("egress: set %s: %w", peerSet, err)
	}
	c.FlushSet(s)
	if err := c.SetAddElements(s, peerElements(peers)); err != nil {
		return err
	}
	return c.Flush()
}

// Stats are the pod's connection counts since the point started.
func (p *PodPoint) Stats() egress.Stats {
	return egress.Stats{Allowed: p.eng.only.allowed.Load(), Denied: p.eng.only.denied.Load()}
}

// Close stops the servers and ends every proxied connection; the rules
// stay (the pod keeps no way out). It waits for every goroutine it
// started.
func (p *PodPoint) Close() error {
	for _, s := range p.servers {
		_ = s.Shutdown()
	}
	for _, c := range p.closers {
		_ = c.Close()
	}
	p.eng.cancel()
	p.eng.wg.Wait()
	return nil
}

// markSocket gives a socket PodMark (net.Dialer.Control).
func markSocket(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, PodMark) })
	if err == nil {
		err = serr
	}
	return err
}

// newMarkedSocket is newTCPSocket with PodMark.
func newMarkedSocket(context.Context) (int, error) {
	fd, err := newTCPSocket()
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, PodMark); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mark socket: %w", err)
	}
	return fd, nil
}

const peerSet = "peers"

func peerElements(peers []netip.Addr) []nftables.SetElement {
	var els []nftables.SetElement
	for _, a := range peers {
		if a = a.Unmap(); a.Is4() {
			els = append(els, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	return els
}

// ipsDstNAT is conntrack's IPS_DST_NAT status bit: the connection's
// destination was rewritten (here: by out-nat's redirects).
const ipsDstNAT = 1 << 5

// installPodRules writes the pod's table (see above) in the calling
// thread's network namespace, replacing one left by an earlier point.
func installPodRules(proxyPort, dnsPort int, peers []netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: "sandgate"}
	// add, delete, add: one transaction that replaces the table whether
	// or not it was there.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	chain := chainIn(c, t)
	outNAT := chain("out-nat", nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest, &accept)
	out := chain("out", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter, &drop)
	in := chain("in", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter, &drop)
	set := &nftables.Set{Table: t, Name: peerSet, KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(set, peerElements(peers)); err != nil {
		return fmt.Errorf("set %s: %w", peerSet, err)
	}
	rule := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	}
	accepted := []expr.Any{verdict(expr.VerdictAccept)}
	marked := []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1}, eq(binaryutil.NativeEndian.PutUint32(PodMark))}
	oifLo := []expr.Any{&expr.Meta{Key: expr.MetaKeyOIF, Register: 1}, eq(binaryutil.NativeEndian.PutUint32(loIndex))}
	iifLo := []expr.Any{&expr.Meta{Key: expr.MetaKeyIIF, Register: 1}, eq(binaryutil.NativeEndian.PutUint32(loIndex))}
	peer := func(offset uint32) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, eq([]byte{unix.NFPROTO_IPV4}),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		}
	}
	const saddr, daddr = 12, 16
	dnatted := []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}

	rule(outNAT, cat(marked, accepted)...)
	rule(outNAT, cat(oifLo, accepted)...)
	rule(outNAT, cat(peer(daddr), accepted)...)
	rule(outNAT, cat(l4(unix.IPPROTO_TCP), dport(53), redir(dnsPort))...)
	rule(outNAT, cat(l4(unix.IPPROTO_UDP), dport(53), redir(dnsPort))...)
	rule(outNAT, cat(l4(unix.IPPROTO_TCP), redir(proxyPort))...)

	// The output hook's device is the one routed before out-nat rerouted
	// a redirected packet to loopback: those are told by conntrack.
	rule(out, cat(marked, accepted)...)
	rule(out, cat(oifLo, accepted)...)
	rule(out, cat(dnatted, accepted)...)
	rule(out, cat(peer(daddr), accepted)...)

	rule(in, cat(iifLo, accepted)...)
	rule(in, cat(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accepted)...)
	rule(in, cat(peer(saddr), accepted)...)
	return c.Flush()
}
