package point

import (
	"encoding/binary"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// installRules writes the router namespace's whole ruleset (table inet
// sandgate), in one transaction:
//
//	guard    (prerouting, mangle): IPv6 dropped; a packet whose source
//	         address does not route back out of the interface it came in
//	         on is dropped (anti-spoofing: a sandbox cannot speak as another)
//	redirect (prerouting, dstnat): TCP and UDP to port 53 → the DNS port,
//	         any other TCP → the proxy port (both on the router's address)
//	input    (policy drop): established, loopback, and the two ports only
//	forward  (policy drop): only between members of one group (group.go)
func installRules(router netns.NsHandle, proxyPort, dnsPort int) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(router)))
	if err != nil {
		return err
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "sandgate"})
	drop, accept := nftables.ChainPolicyDrop, nftables.ChainPolicyAccept
	chain := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority, pol *nftables.ChainPolicy) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: pol})
	}
	guard := chain("guard", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityMangle, &accept)
	redirect := chain("redirect", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, &accept)
	input := chain("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter, &drop)
	forward := chain("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter, &drop)
	pairs, err := addGroupSet(c, t)
	if err != nil {
		return err
	}

	rule := func(ch *nftables.Chain, exprs ...expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: exprs})
	}
	verdict := func(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }
	eq := func(data []byte) expr.Any { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }
	l4 := func(proto byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, eq([]byte{proto})}
	}
	dport := func(port int) []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			eq(binaryutil.BigEndian.PutUint16(uint16(port))),
		}
	}
	cat := func(parts ...[]expr.Any) []expr.Any {
		var out []expr.Any
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	notLo := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(1)},
	}

	rule(guard, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, eq([]byte{unix.NFPROTO_IPV6}), verdict(expr.VerdictDrop))
	rule(guard, cat(notLo, []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		eq(make([]byte, 4)),
		verdict(expr.VerdictDrop),
	})...)

	redir := func(port int) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
			&expr.Redir{RegisterProtoMin: 1},
		}
	}
	// Group traffic is routed as it is, before any redirect.
	rule(redirect, groupPair(pairs, expr.VerdictAccept)...)
	rule(forward, groupPair(pairs, expr.VerdictAccept)...)
	rule(redirect, cat(notLo, l4(unix.IPPROTO_TCP), dport(53), redir(dnsPort))...)
	rule(redirect, cat(notLo, l4(unix.IPPROTO_UDP), dport(53), redir(dnsPort))...)
	rule(redirect, cat(notLo, l4(unix.IPPROTO_TCP), redir(proxyPort))...)

	established := make([]byte, 4)
	binary.NativeEndian.PutUint32(established, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	rule(input,
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: established, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		verdict(expr.VerdictAccept))
	rule(input, &expr.Meta{Key: expr.MetaKeyIIF, Register: 1}, eq(binaryutil.NativeEndian.PutUint32(1)), verdict(expr.VerdictAccept))
	rule(input, cat(l4(unix.IPPROTO_TCP), dport(proxyPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(l4(unix.IPPROTO_TCP), dport(dnsPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(l4(unix.IPPROTO_UDP), dport(dnsPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	return c.Flush()
}
