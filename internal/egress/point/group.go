package point

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/egress"
)

// Groups: the sandboxes of one group reach each other at their pool
// addresses on every port and protocol. The router forwards a packet only
// when its (source, destination) pair is in the set group_pairs, which
// holds both directions of every pair of members of each group; nothing
// else crosses the router. The guard chain's reverse-path check drops a
// packet whose source is not the address of the veth it came in on, so a
// sandbox that takes another's address reaches neither that one's group
// nor its policy.

const groupSet = "group_pairs"

// addGroupSet declares the set of member pairs in table t (installRules).
func addGroupSet(c *nftables.Conn, t *nftables.Table) (*nftables.Set, error) {
	s := &nftables.Set{
		Table:         t,
		Name:          groupSet,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr),
		Concatenation: true,
	}
	if err := c.AddSet(s, nil); err != nil {
		return nil, fmt.Errorf("set %s: %w", groupSet, err)
	}
	return s, nil
}

// groupPair is a rule's expressions: IPv4 with "ip saddr . ip daddr" in
// pairs → verdict.
func groupPair(pairs *nftables.Set, verdict expr.VerdictKind) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		// Source into register 1 (32-bit register 8), destination into 9:
		// adjacent, the concatenated key the set's lookup reads.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: pairs.Name, SetID: pairs.ID},
		&expr.Verdict{Kind: verdict},
	}
}

// JoinGroup puts sandbox id, whose network namespace is the file nsPath,
// into group (an opaque name; "" is refused): from its return id and every
// other member reach each other at their addresses. A sandbox that is not
// attached is attached first with policy none (no way out but to its
// group). It returns id's address. A sandbox is in one group: joining
// another is an error; joining its own again only returns its address.
func (p *Point) JoinGroup(id, nsPath, group string) (netip.Addr, error) {
	if group == "" {
		return netip.Addr{}, errors.New("egress: empty group")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.attached[id]
	if !ok {
		var err error
		if a, err = p.attach(id, nsPath, egress.Policy{Mode: egress.ModeNone}); err != nil {
			return netip.Addr{}, err
		}
	}
	switch a.group {
	case group:
		return a.m.addr, nil
	case "":
	default:
		return netip.Addr{}, fmt.Errorf("egress: %s is in another group", id)
	}
	var elems []nftables.SetElement
	for _, o := range p.attached {
		if o != a && o.group == group {
			elems = append(elems, pairElem(a.m.addr, o.m.addr), pairElem(o.m.addr, a.m.addr))
		}
	}
	if err := p.setPairs(elems, true); err != nil {
		if !ok {
			p.detach(id, a)
		}
		return netip.Addr{}, fmt.Errorf("egress: join group: %w", err)
	}
	a.group = group
	return a.m.addr, nil
}

// Address is id's address in the pool, if it is attached.
func (p *Point) Address(id string) (netip.Addr, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.attached[id]
	if !ok {
		return netip.Addr{}, false
	}
	return a.m.addr, true
}

// leave removes a's pairs (Detach). Called with p.mu held.
func (p *Point) leave(id string, a *attachment) {
	if a.group == "" {
		return
	}
	var elems []nftables.SetElement
	for _, o := range p.attached {
		if o != a && o.group == a.group {
			elems = append(elems, pairElem(a.m.addr, o.m.addr), pairElem(o.m.addr, a.m.addr))
		}
	}
	if err := p.setPairs(elems, false); err != nil {
		// Its veth goes next: no packet of its address arrives anymore.
		p.opts.Logger.Warn("egress: leave group", "sandbox", id, "err", err)
	}
	a.group = ""
}

func pairElem(src, dst netip.Addr) nftables.SetElement {
	s, d := src.As4(), dst.As4()
	return nftables.SetElement{Key: append(s[:], d[:]...)}
}

// setPairs adds (or deletes) elems in the router's set in one transaction.
// Called with p.mu held.
func (p *Point) setPairs(elems []nftables.SetElement, add bool) error {
	if len(elems) == 0 || p.router < 0 {
		return nil
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(p.router)))
	if err != nil {
		return err
	}
	s := &nftables.Set{
		Table:         &nftables.Table{Family: nftables.TableFamilyINet, Name: "sandgate"},
		Name:          groupSet,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr),
		Concatenation: true,
	}
	if add {
		err = c.SetAddElements(s, elems)
	} else {
		err = c.SetDeleteElements(s, elems)
	}
	if err != nil {
		return err
	}
	return c.Flush()
}
