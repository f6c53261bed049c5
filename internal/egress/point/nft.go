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
	chain := chainIn(c, t)
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
	notLo := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIF, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(loIndex)},
	}

	rule(guard, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, eq([]byte{unix.NFPROTO_IPV6}), verdict(expr.VerdictDrop))
	rule(guard, cat(notLo, []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		eq(make([]byte, 4)),
		verdict(expr.VerdictDrop),
	})...)

	// Group traffic is routed as it is, before any redirect.
	rule(redirect, groupPair(pairs, expr.VerdictAccept)...)
	rule(forward, groupPair(pairs, expr.VerdictAccept)...)
	rule(redirect, cat(notLo, l4(unix.IPPROTO_TCP), dport(53), redir(dnsPort))...)
	rule(redirect, cat(notLo, l4(unix.IPPROTO_UDP), dport(53), redir(dnsPort))...)
	rule(redirect, cat(notLo, l4(unix.IPPROTO_TCP), redir(proxyPort))...)

	rule(input, append(ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))...)
	rule(input, &expr.Meta{Key: expr.MetaKeyIIF, Register: 1}, eq(binaryutil.NativeEndian.PutUint32(loIndex)), verdict(expr.VerdictAccept))
	rule(input, cat(l4(unix.IPPROTO_TCP), dport(proxyPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(l4(unix.IPPROTO_TCP), dport(dnsPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	rule(input, cat(l4(unix.IPPROTO_UDP), dport(dnsPort), []expr.Any{verdict(expr.VerdictAccept)})...)
	return c.Flush()
}

// loIndex is the loopback's interface index, in every network namespace.
const loIndex = 1

// Expression helpers shared by the router's rules and a pod's (pod.go).
// Each leaves its operands in register 1.

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func eq(data []byte) expr.Any { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data} }

// l4 matches the transport protocol.
func l4(proto byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, eq([]byte{proto})}
}

// dport matches the transport header's destination port.
func dport(port int) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		eq(binaryutil.BigEndian.PutUint16(uint16(port))),
	}
}

// redir sends the packet to port on the host itself (nat chains only).
func redir(port int) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
		&expr.Redir{RegisterProtoMin: 1},
	}
}

// ctState matches a connection tracking state among bits.
func ctState(bits uint32) []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, bits)
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// chainIn returns a function that adds a base chain to table t in c.
func chainIn(c *nftables.Conn, t *nftables.Table) func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority, pol *nftables.ChainPolicy) *nftables.Chain {
	return func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority, pol *nftables.ChainPolicy) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: pol})
	}
}
