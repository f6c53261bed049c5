// Package egress says where a sandbox's network traffic may go: a Policy
// names the domains and address ranges a sandbox may reach. It is a leaf
// (the providers' interface and the store hold policies); package
// egress/point enforces them: its Point is the one way out of an attached
// sandbox's network namespace, its DNS server answers only allowed names
// and its TCP proxy admits only connections the policy allows, dialling
// them from the gateway's side. Nothing else leaves: every packet a sandbox
// sends ends in a socket of the Point or is dropped outside its reach.
package egress

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Mode is a policy's kind.
type Mode string

const (
	// ModeNone: no network beyond loopback (the default).
	ModeNone Mode = "none"
	// ModeAll: any destination and any name but those Deny names (never
	// loopback, link-local or multicast: see reserved). Written "all", or
	// {allow: ["*"], deny: [...]} with exceptions.
	ModeAll Mode = "all"
	// ModeRules: only what Allow names, never what Deny names.
	ModeRules Mode = "rules"
)

// Policy is a sandbox's egress policy. The zero value is ModeNone. A Policy
// is immutable once parsed: share it freely.
type Policy struct {
	Mode  Mode
	Allow []Rule
	Deny  []Rule
}

// Rule is one entry of an allow or deny list: a domain (exact, or
// "*.example.org" for every name under example.org but not the apex) or a
// CIDR (v4 or v6; a bare address is its /32 or /128).
type Rule struct {
	Domain   string // lower case, no trailing dot; "" for a CIDR rule
	Wildcard bool   // Domain came as "*.Domain"
	Prefix   netip.Prefix
}

// String renders r as it is written in a policy.
func (r Rule) String() string {
	switch {
	case r.Domain == "":
		return r.Prefix.String()
	case r.Wildcard:
		return "*." + r.Domain
	default:
		return r.Domain
	}
}

// None reports whether p gives no network at all.
func (p Policy) None() bool { return p.Mode == "" || p.Mode == ModeNone }

// ParseRule parses one list entry.
func ParseRule(s string) (Rule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Rule{}, fmt.Errorf("empty entry")
	}
	if strings.ContainsAny(s, ":/") || isAddr(s) {
		if p, err := netip.ParsePrefix(s); err == nil {
			return Rule{Prefix: p.Masked()}, nil
		}
		if a, err := netip.ParseAddr(s); err == nil {
			return Rule{Prefix: netip.PrefixFrom(a, a.BitLen())}, nil
		}
		return Rule{}, fmt.Errorf("%q is not a CIDR or an address", s)
	}
	d := strings.ToLower(strings.TrimSuffix(s, "."))
	r := Rule{}
	if rest, ok := strings.CutPrefix(d, "*."); ok {
		r.Wildcard, d = true, rest
	}
	if !validDomain(d) {
		return Rule{}, fmt.Errorf("%q is not a domain, a *.domain or a CIDR", s)
	}
	r.Domain = d
	return r, nil
}

func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// validDomain accepts LDH labels (and _) of 1..63 characters, 253 in all,
// the last not all digits.
func validDomain(d string) bool {
	if d == "" || len(d) > 253 {
		return false
	}
	// A last label of digits only is an address in disguise ("1.2.3.4.").
	if tld := d[strings.LastIndexByte(d, '.')+1:]; strings.Trim(tld, "0123456789") == "" {
		return false
	}
	for label := range strings.SplitSeq(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// NewRules builds a ModeRules policy from allow and deny entries. It returns
// every bad entry, each as "allow[i]: why" or "deny[i]: why".
func NewRules(allow, deny []string) (Policy, []string) {
	p := Policy{Mode: ModeRules}
	var bad []string
	parse := func(list string, entries []string) []Rule {
		rules := make([]Rule, 0, len(entries))
		for i, e := range entries {
			r, err := ParseRule(e)
			if err != nil {
				bad = append(bad, fmt.Sprintf("%s[%d]: %v", list, i, err))
				continue
			}
			rules = append(rules, r)
		}
		return rules
	}
	// "*" allows everything (what a default-allow policy with exceptions
	// means): ModeAll, keeping the deny list.
	if i := slices.Index(allow, "*"); i >= 0 {
		p.Mode = ModeAll
		allow = slices.Delete(slices.Clone(allow), i, i+1)
		if len(allow) > 0 {
			bad = append(bad, `allow: "*" allows everything; it cannot be combined with other entries`)
		}
	}
	p.Allow = parse("allow", allow)
	p.Deny = parse("deny", deny)
	return p, bad
}

// Parse reads the API's form of a policy: "none", "all", or
// {"allow": [...], "deny": [...]}. It returns every problem found.
func Parse(raw json.RawMessage) (Policy, []string) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch Mode(s) {
		case ModeNone, "":
			return Policy{Mode: ModeNone}, nil
		case ModeAll:
			return Policy{Mode: ModeAll}, nil
		}
		return Policy{}, []string{fmt.Sprintf("%q is not none, all or {allow, deny}", s)}
	}
	var lists struct {
		Allow []string `json:"allow"`
		Deny  []string `json:"deny"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&lists); err != nil {
		return Policy{}, []string{fmt.Sprintf("want none, all or {allow: [...], deny: [...]}: %v", err)}
	}
	return NewRules(lists.Allow, lists.Deny)
}

// MarshalJSON writes the form Parse reads.
func (p Policy) MarshalJSON() ([]byte, error) {
	switch {
	case p.None():
		return json.Marshal(ModeNone)
	case p.Mode == ModeAll && len(p.Deny) == 0:
		return json.Marshal(ModeAll)
	}
	str := func(rs []Rule) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			out[i] = r.String()
		}
		return out
	}
	allow := str(p.Allow)
	if p.Mode == ModeAll {
		allow = []string{"*"}
	}
	return json.Marshal(struct {
		Allow []string `json:"allow"`
		Deny  []string `json:"deny"`
	}{allow, str(p.Deny)})
}

// UnmarshalJSON reads the form Parse reads; a bad policy is an error naming
// every problem.
func (p *Policy) UnmarshalJSON(b []byte) error {
	q, bad := Parse(b)
	if len(bad) > 0 {
		return fmt.Errorf("egress policy: %s", strings.Join(bad, "; "))
	}
	*p = q
	return nil
}

func (r Rule) matchName(name string) bool {
	if r.Domain == "" {
		return false
	}
	if r.Wildcard {
		return strings.HasSuffix(name, "."+r.Domain)
	}
	return name == r.Domain
}

// NormName is name as rules and answers compare it: lower case, no
// trailing dot.
func NormName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// AllowsName reports whether the sandbox may resolve name (and reach it,
// as far as names go): deny wins over allow.
func (p Policy) AllowsName(name string) bool {
	name = NormName(name)
	switch {
	case p.None():
		return false
	case slices.ContainsFunc(p.Deny, func(r Rule) bool { return r.matchName(name) }):
		return false
	case p.Mode == ModeAll:
		return true
	}
	return slices.ContainsFunc(p.Allow, func(r Rule) bool { return r.matchName(name) })
}

func matchAddr(rules []Rule, a netip.Addr) bool {
	a = a.Unmap()
	return slices.ContainsFunc(rules, func(r Rule) bool { return r.Domain == "" && r.Prefix.Contains(a) })
}

// Reasons a connection is refused, as logged and counted.
const (
	ReasonNone     = "policy none"
	ReasonReserved = "reserved address"
	ReasonDenied   = "denied"
	ReasonNotAllow = "not allowed"
	ReasonName     = "server name not allowed"
)

// reserved are destinations no policy reaches: they would land on the
// gateway's own side (its loopback, its pool) rather than the network.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/3"),
	netip.MustParsePrefix("::/127"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("ff00::/8"),
}

// Admission is how a connection was decided.
type Admission struct {
	Allowed bool
	Reason  string // why not, when !Allowed
	// ByName: admitted only through a domain rule, so the server name the
	// client sends (TLS SNI, HTTP Host), when it sends one, must be allowed
	// too (CheckServerName).
	ByName bool
}

// Admit decides a TCP connection to dst, given the names the Point's DNS
// answered dst with for this sandbox.
func (p Policy) Admit(dst netip.Addr, names []string) Admission {
	dst = dst.Unmap()
	switch {
	case p.None():
		return Admission{Reason: ReasonNone}
	case slices.ContainsFunc(reserved, func(r netip.Prefix) bool { return r.Contains(dst) }):
		return Admission{Reason: ReasonReserved}
	case matchAddr(p.Deny, dst):
		return Admission{Reason: ReasonDenied}
	case p.Mode == ModeAll:
		return Admission{Allowed: true}
	case matchAddr(p.Allow, dst):
		return Admission{Allowed: true}
	}
	for _, n := range names {
		if p.AllowsName(n) {
			return Admission{Allowed: true, ByName: true}
		}
	}
	return Admission{Reason: ReasonNotAllow}
}

// CheckServerName is the second step of a connection admitted ByName: the
// name the client sent ("" when it sent none) must be allowed. A denied
// name refuses any connection, whatever admitted it.
func (p Policy) CheckServerName(a Admission, name string) Admission {
	if !a.Allowed || name == "" {
		return a
	}
	n := NormName(name)
	if slices.ContainsFunc(p.Deny, func(r Rule) bool { return r.matchName(n) }) {
		return Admission{Reason: ReasonName}
	}
	if a.ByName && !p.AllowsName(n) {
		return Admission{Reason: ReasonName}
	}
	return a
}

// Stats are one sandbox's connection counts since it was attached.
type Stats struct {
	Allowed int64 `json:"allowed"`
	Denied  int64 `json:"denied"`
}

// DeniesNames reports whether p has a domain in its deny list: then every
// connection's server name is checked, whatever admitted it.
func (p *Policy) DeniesNames() bool {
	for _, r := range p.Deny {
		if r.Domain != "" {
			return true
		}
	}
	return false
}
