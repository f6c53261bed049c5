package egress_test

import (
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/egress"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // re-marshalled; "" = invalid
		bad  int
	}{
		{`"none"`, `"none"`, 0},
		{`"all"`, `"all"`, 0},
		{`{"allow":["PyPI.example.","*.example.org","10.0.0.0/8","2001:db8::/32","192.0.2.7"]}`,
			`{"allow":["pypi.example","*.example.org","10.0.0.0/8","2001:db8::/32","192.0.2.7/32"],"deny":[]}`, 0},
		{`{"allow":["*"],"deny":["evil.test"]}`, `{"allow":["*"],"deny":["evil.test"]}`, 0},
		{`{"allow":["*","a.test"]}`, "", 1},
		{`{"allow":["bad domain","10.0.0.0/33",""],"deny":["-x.test"]}`, "", 4},
		{`"some"`, "", 1},
		{`{"allow":["a.test"],"other":1}`, "", 1},
		{`42`, "", 1},
	} {
		p, bad := egress.Parse(json.RawMessage(c.in))
		if len(bad) != c.bad {
			t.Errorf("%s: problems %q, want %d", c.in, bad, c.bad)
			continue
		}
		if c.want == "" {
			continue
		}
		got, err := json.Marshal(p)
		if err != nil || string(got) != c.want {
			t.Errorf("%s: marshalled %s %v, want %s", c.in, got, err, c.want)
		}
		var back egress.Policy
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("%s: round trip: %v", c.in, err)
		}
	}
}

func TestMatch(t *testing.T) {
	p, bad := egress.NewRules([]string{"a.test", "*.example.org", "203.0.113.0/24"}, []string{"x.example.org", "203.0.113.9"})
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	for name, want := range map[string]bool{
		"a.test": true, "A.TEST.": true, "b.test": false, "sub.a.test": false,
		"y.example.org": true, "deep.y.example.org": true, "example.org": false, "x.example.org": false,
	} {
		if got := p.AllowsName(name); got != want {
			t.Errorf("AllowsName(%s) = %v", name, got)
		}
	}
	addr := netip.MustParseAddr
	for _, c := range []struct {
		dst    string
		names  []string
		sni    string
		allow  bool
		reason string
	}{
		{"203.0.113.5", nil, "", true, ""},
		{"203.0.113.9", nil, "", false, egress.ReasonDenied},
		{"203.0.113.5", nil, "x.example.org", false, egress.ReasonName}, // deny wins, even for a CIDR
		{"198.51.100.1", []string{"a.test"}, "", true, ""},
		{"198.51.100.1", []string{"a.test"}, "a.test", true, ""},
		{"198.51.100.1", []string{"a.test"}, "b.test", false, egress.ReasonName},
		{"198.51.100.2", nil, "", false, egress.ReasonNotAllow},
		{"127.0.0.1", []string{"a.test"}, "", false, egress.ReasonReserved},
	} {
		a := p.CheckServerName(p.Admit(addr(c.dst), c.names), c.sni)
		if a.Allowed != c.allow || (!c.allow && a.Reason != c.reason) {
			t.Errorf("%s %v sni %q: %+v", c.dst, c.names, c.sni, a)
		}
	}
	if a := (egress.Policy{}).Admit(addr("203.0.113.5"), nil); a.Allowed || a.Reason != egress.ReasonNone {
		t.Errorf("none admitted: %+v", a)
	}
	all, _ := egress.Parse(json.RawMessage(`{"allow":["*"],"deny":["10.0.0.0/8","bad.test"]}`))
	if !all.Admit(addr("8.8.8.8"), nil).Allowed || all.Admit(addr("10.1.1.1"), nil).Allowed || all.AllowsName("bad.test") || !all.AllowsName("good.test") {
		t.Error("all with exceptions")
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"a.test", "*.x.org", "10.0.0.0/8", "::1", "*", "a..b", strings.Repeat("a", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := egress.ParseRule(s)
		if err != nil {
			return
		}
		// What parses prints to something that parses to the same rule.
		r2, err := egress.ParseRule(r.String())
		if err != nil || r2 != r {
			t.Fatalf("%q → %q → %+v %v", s, r.String(), r2, err)
		}
	})
}
