package point

import "net/netip"

// Addr is attached sandbox id's address (its end of its veth), and
// whether it is attached.
func (p *Point) Addr(id string) (netip.Addr, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.attached[id]
	if !ok {
		return netip.Addr{}, false
	}
	return a.m.addr, true
}
