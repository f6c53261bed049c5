package egress

import "testing"

// Reserved are the prefixes Admit refuses as reserved under any policy,
// and a copy: changing it changes nothing.
func TestReserved(t *testing.T) {
	all := Policy{Mode: ModeAll}
	rs := Reserved()
	if len(rs) == 0 {
		t.Fatal("no reserved prefixes")
	}
	for _, p := range rs {
		if a := all.Admit(p.Addr(), nil); a.Allowed || a.Reason != ReasonReserved {
			t.Errorf("%v: %+v, want refused as reserved", p, a)
		}
	}
	rs[0] = rs[len(rs)-1]
	if Reserved()[0] == rs[0] && len(rs) > 1 {
		t.Error("Reserved hands out its own slice")
	}
}
