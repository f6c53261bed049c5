package e2b

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
)

// E2B's egress settings (allow_internet_access and network's allowOut and
// denyOut) as sandgate egress policies. E2B's semantics: a sandbox reaches
// the internet unless told otherwise; allow_internet_access false is
// denyOut ["0.0.0.0/0"]; domains may only be allowed, and only when all
// else is denied; allowOut wins over denyOut. sandgate's deny wins over
// its allow, so the one combination it cannot keep (an allowOut address
// inside a denyOut range, without a deny of everything) is refused.

// networkBody holds the members of create's network that are served.
type networkBody struct {
	AllowOut []string
	DenyOut  []string
}

// allTraffic are the denyOut entries that deny everything (E2B's
// ALL_TRAFFIC is the first).
var allTraffic = []string{"0.0.0.0/0", "::/0"}

// egressOf is the sandgate policy of a create's allow_internet_access and
// network (nil when neither is given: the provider's default stays), with
// every problem added to bad.
func egressOf(allowInternet *bool, raw json.RawMessage, bad *providers.InvalidFields) *egress.Policy {
	given := len(raw) > 0 && string(raw) != "null"
	if allowInternet == nil && !given {
		return nil
	}
	var nb networkBody
	if given {
		var members map[string]json.RawMessage
		if err := json.Unmarshal(raw, &members); err != nil {
			bad.Add("network", "must be an object with allowOut and denyOut lists")
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(members)) {
			v := members[k]
			if bytes.Equal(v, []byte("null")) {
				continue
			}
			var err error
			switch k {
			case "allowOut":
				err = json.Unmarshal(v, &nb.AllowOut)
			case "denyOut":
				err = json.Unmarshal(v, &nb.DenyOut)
			default:
				bad.Add("network."+k, "is not supported by sandgate's E2B face (allowOut and denyOut are)")
				continue
			}
			if err != nil {
				bad.Add("network."+k, "must be a list of strings")
			}
		}
	}
	denyAll := allowInternet != nil && !*allowInternet
	var deny []string
	for _, d := range nb.DenyOut {
		if slices.Contains(allTraffic, d) {
			denyAll = true
		} else {
			deny = append(deny, d)
		}
	}
	if denyAll {
		// Everything is denied but allowOut, which wins over the rest of
		// denyOut: sandgate's rules allowing allowOut alone.
		pol, errs := egress.NewRules(nb.AllowOut, nil)
		addAll(bad, "network.allowOut", errs)
		if len(nb.AllowOut) == 0 {
			pol = egress.Policy{Mode: egress.ModeNone}
		}
		return &pol
	}
	// Everything is allowed but denyOut, which allowOut may pierce.
	pol, errs := egress.NewRules([]string{"*"}, deny)
	addAll(bad, "network.denyOut", errs)
	for i, a := range nb.AllowOut {
		r, err := egress.ParseRule(a)
		switch {
		case err != nil:
			bad.Add(fmt.Sprintf("network.allowOut[%d]", i), "%v", err)
		case r.Domain != "":
			bad.Add(fmt.Sprintf("network.allowOut[%d]", i), "a domain may be allowed only when everything else is denied (denyOut [\"0.0.0.0/0\"] or allow_internet_access false)")
		default:
			for _, d := range pol.Deny {
				if d.Domain == "" && d.Prefix.Overlaps(r.Prefix) {
					bad.Add(fmt.Sprintf("network.allowOut[%d]", i), "%s overlaps denyOut's %s: sandgate cannot let an allow entry pierce a deny entry (deny everything and list what is allowed instead)", r.Prefix, d.Prefix)
				}
			}
		}
	}
	return &pol
}

// addAll adds egress's problems ("allow[0]: why") under prefix.
func addAll(bad *providers.InvalidFields, prefix string, errs []string) {
	for _, e := range errs {
		bad.Add(prefix, "%s", e)
	}
}

// networkReply is a sandbox's egress as E2B's get describes it.
type networkReply struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// egressReply describes pol in E2B's terms: whether the sandbox reaches
// the internet beyond its lists, and the lists; nothing for a sandbox
// without a policy (the provider's default, which is not described).
func egressReply(pol *egress.Policy) (*bool, *networkReply) {
	if pol == nil {
		return nil, nil
	}
	no, yes := false, true
	if pol.None() {
		return &no, &networkReply{DenyOut: allTraffic[:1]}
	}
	str := func(rs []egress.Rule) []string {
		out := make([]string, len(rs))
		for i, r := range rs {
			out[i] = r.String()
		}
		return out
	}
	if pol.Mode == egress.ModeAll {
		return &yes, &networkReply{DenyOut: str(pol.Deny)}
	}
	return &no, &networkReply{AllowOut: str(pol.Allow), DenyOut: append(allTraffic[:1:1], str(pol.Deny)...)}
}
