package handlers

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

func (s *server) SetSandboxNetwork(ctx context.Context, req api.SetSandboxNetworkRequestObject) (api.SetSandboxNetworkResponseObject, error) {
	pol, bad := parseEgress("egress", req.Body.Egress)
	if len(bad) > 0 {
		return nil, bad
	}
	i, err := s.svc.SetNetwork(ctx, callerFrom(ctx), req.ID, pol)
	if err != nil {
		return nil, err
	}
	return api.SetSandboxNetwork200JSONResponse(info(i)), nil
}

func (s *server) SetSandboxHosts(ctx context.Context, req api.SetSandboxHostsRequestObject) (api.SetSandboxHostsResponseObject, error) {
	if req.Body == nil {
		return nil, providers.InvalidFields{{Field: "hosts", Message: "the body must be an object of host name -> address"}}
	}
	hosts, err := sandbox.ParseHosts(*req.Body)
	if err != nil {
		return nil, err
	}
	i, err := s.svc.SetHosts(ctx, callerFrom(ctx), req.ID, hosts)
	if err != nil {
		return nil, err
	}
	return api.SetSandboxHosts200JSONResponse(info(i)), nil
}

// parseEgress reads an egress policy in the API's form; nil is none.
func parseEgress(field string, v any) (egress.Policy, providers.InvalidFields) {
	if v == nil {
		return egress.Policy{Mode: egress.ModeNone}, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return egress.Policy{}, providers.InvalidFields{{Field: field, Message: err.Error()}}
	}
	pol, problems := egress.Parse(raw)
	return pol, fieldErrors(field, problems)
}

// fieldErrors turns egress's "list[i]: why" problems into field errors.
func fieldErrors(field string, problems []string) providers.InvalidFields {
	var bad providers.InvalidFields
	for _, p := range problems {
		f, msg := field, p
		if where, why, ok := strings.Cut(p, ": "); ok && !strings.ContainsAny(where, " \"") {
			f, msg = field+"."+where, why
		}
		bad = append(bad, providers.FieldError{Field: f, Message: msg})
	}
	return bad
}

// gymEgressKeys are NeMo Gym's provider_options that mean network.egress.
var gymEgressKeys = []string{"network_policy", "allowed_domains", "allowed_cidrs", "blocked_domains", "blocked_cidrs"}

// createEgress is a create's egress policy (nil: none asked) from
// network.egress or NeMo Gym's provider_options shapes (which are taken out
// of the options the provider sees). Every problem is listed.
func createEgress(network *api.Network, opts map[string]any) (*egress.Policy, map[string]any, providers.InvalidFields) {
	var gym []string
	for _, k := range gymEgressKeys {
		if _, ok := opts[k]; ok {
			gym = append(gym, k)
		}
	}
	given := network != nil && network.Egress != nil
	if len(gym) == 0 {
		if !given {
			return nil, opts, nil
		}
		pol, bad := parseEgress("network.egress", network.Egress)
		return &pol, opts, bad
	}
	rest := maps.Clone(opts)
	for _, k := range gym {
		delete(rest, k)
	}
	if given {
		return nil, rest, providers.InvalidFields{{Field: "network.egress", Message: "give either network.egress or provider_options." + gym[0] + ", not both"}}
	}
	var allow, deny []string
	var bad providers.InvalidFields
	if np, ok := opts["network_policy"]; ok {
		if len(gym) > 1 {
			bad = append(bad, providers.FieldError{Field: "provider_options.network_policy", Message: "give either network_policy or the allowed_*/blocked_* lists, not both"})
		}
		allow, deny, bad = gymNetworkPolicy(np, bad)
	} else {
		var listBad providers.InvalidFields
		list := func(key string, cidr bool) []string {
			field := "provider_options." + key
			raw, ok := opts[key]
			if !ok || raw == nil {
				return nil
			}
			items, ok := raw.([]any)
			if !ok {
				listBad = append(listBad, providers.FieldError{Field: field, Message: "must be a list of strings"})
				return nil
			}
			var out []string
			for i, it := range items {
				str, ok := it.(string)
				r, err := egress.ParseRule(str)
				switch {
				case !ok:
					err = fmt.Errorf("must be a string")
				case err == nil && cidr != (r.Domain == ""):
					err = fmt.Errorf("%q is not a %s", str, map[bool]string{true: "CIDR", false: "domain"}[cidr])
				}
				if err != nil {
					listBad = append(listBad, providers.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Message: err.Error()})
					continue
				}
				out = append(out, str)
			}
			return out
		}
		allow = append(list("allowed_domains", false), list("allowed_cidrs", true)...)
		deny = append(list("blocked_domains", false), list("blocked_cidrs", true)...)
		_, hasAllowD := opts["allowed_domains"]
		_, hasAllowC := opts["allowed_cidrs"]
		if !hasAllowD && !hasAllowC {
			// Only blocked lists: everything else is allowed.
			allow = []string{"*"}
		}
		bad = append(bad, listBad...)
	}
	if len(bad) > 0 {
		return nil, rest, bad
	}
	pol, problems := egress.NewRules(allow, deny)
	if len(problems) > 0 {
		return nil, rest, fieldErrors("provider_options", problems)
	}
	return &pol, rest, nil
}

// gymNetworkPolicy reads OpenSandbox's network_policy: defaultAction
// (allow|deny, default deny) and egress rules [{action, target}].
func gymNetworkPolicy(v any, bad providers.InvalidFields) (allow, deny []string, _ providers.InvalidFields) {
	const field = "provider_options.network_policy"
	var np struct {
		DefaultAction string `json:"defaultAction"`
		Egress        []struct {
			Action string `json:"action"`
			Target string `json:"target"`
		} `json:"egress"`
	}
	raw, _ := json.Marshal(v)
	if err := json.Unmarshal(raw, &np); err != nil {
		return nil, nil, append(bad, providers.FieldError{Field: field, Message: "want {defaultAction, egress: [{action, target}]}"})
	}
	switch strings.ToLower(np.DefaultAction) {
	case "", "deny":
	case "allow":
		allow = []string{"*"}
	default:
		bad = append(bad, providers.FieldError{Field: field + ".defaultAction", Message: "must be allow or deny"})
	}
	for i, r := range np.Egress {
		f := fmt.Sprintf("%s.egress[%d]", field, i)
		if _, err := egress.ParseRule(r.Target); err != nil || r.Target == "*" {
			msg := "target must be a domain, a *.domain or a CIDR"
			if err != nil {
				msg = err.Error()
			}
			bad = append(bad, providers.FieldError{Field: f + ".target", Message: msg})
			continue
		}
		switch strings.ToLower(r.Action) {
		case "allow":
			if len(allow) == 0 || allow[0] != "*" {
				allow = append(allow, r.Target)
			}
		case "deny":
			deny = append(deny, r.Target)
		default:
			bad = append(bad, providers.FieldError{Field: f + ".action", Message: "must be allow or deny"})
		}
	}
	return allow, deny, bad
}
