package kubernetes

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
)

// Egress policies and groups live in the sandbox's own NetworkPolicy
// (netpol.go), so they are in the cluster and outlast the gateway:
//
//   - none: no egress rule (the policy as made).
//   - CIDR rules: one egress rule whose peers are ipBlocks, one per allowed
//     CIDR (all: 0.0.0.0/0 and ::/0). NetworkPolicy only allows, so "deny
//     wins" is written as excepts: prefixes are nested or disjoint, so a
//     denied prefix inside an allowed one is an except of it, one holding
//     it drops it, and the rest do not touch it. The destinations no
//     policy reaches anywhere (egress.Reserved: loopback, link-local and
//     so the clouds' metadata servers, multicast) are cut the same way.
//   - all with no deny also allows every pod of every namespace (cluster
//     DNS, which CNIs such as Cilium do not match by ipBlock). With denies
//     it does not: a pod peer cannot except addresses.
//   - Domain rules cannot be written as a NetworkPolicy (it matches
//     addresses, never names): they are ErrUnsupported, unless the pods
//     have their own egress points (sidecar.go), which enforce every
//     policy; their NetworkPolicy then only lets the point's connections
//     out.
//   - A group: the pod and its policy are labelled LabelGroup=<hash of the
//     group id>, and the policy gets an ingress rule from and an egress
//     rule to the pods of that label in the namespace, every port.
//
// Ports are never named, so every rule is for every port and protocol.
// Each change is a read of the policy and a merge patch carrying its
// resourceVersion (another change meanwhile: read again), so SetEgress
// and JoinGroup keep each other's rules.

// LabelGroup labels the pods of a sandbox group, and their policies.
const LabelGroup = "sandgate.group"

var (
	_ providers.Egresser      = (*Kubernetes)(nil)
	_ providers.EgressChecker = (*Kubernetes)(nil)
	_ providers.Grouper       = (*Kubernetes)(nil)
)

// groupLabel is group's LabelGroup value: a hash (a group id is any
// string; a label value is at most 63 characters of a small alphabet).
func groupLabel(group string) string {
	sum := sha256.Sum256([]byte(group))
	return hex.EncodeToString(sum[:])[:40]
}

// errNoPolicies is the answer to a policy or group with NoNetworkPolicy.
func errNoPolicies(what string) error {
	return providers.Errorf(providers.ErrUnsupported,
		"%s need the sandboxes' NetworkPolicies, which this gateway does not make (--k8s-network-policy=false: the cluster's operator isolates the pods)", what)
}

// CheckEgress refuses what SetEgress would, before a create makes a pod:
// without the pods' egress points (sidecar.go), domain rules, and any
// policy but none without NetworkPolicies.
func (k *Kubernetes) CheckEgress(pol egress.Policy) error {
	if k.opts.EgressSidecar {
		return nil
	}
	if _, err := egressRules(pol); err != nil {
		return err
	}
	if k.opts.NoNetworkPolicy && !pol.None() {
		return errNoPolicies("egress policies other than none")
	}
	return nil
}

// SetEgress makes pol sandbox id's policy. With the pods' egress points
// (sidecar.go) the point enforces it, effective when SetEgress returns.
// Without, it is written into the sandbox's NetworkPolicy (see above):
// effective once the CNI applies it (it enforces NetworkPolicy, or
// nothing is), and domain rules are ErrUnsupported, changing nothing.
func (k *Kubernetes) SetEgress(ctx context.Context, id string, pol egress.Policy) error {
	if err := k.CheckEgress(pol); err != nil {
		return err
	}
	if k.opts.EgressSidecar {
		return k.setSidecarEgress(ctx, id, pol)
	}
	if k.opts.NoNetworkPolicy {
		return nil // none, which it has
	}
	if _, err := k.pod(ctx, id); err != nil {
		return err
	}
	return k.writeEgressRules(ctx, id, pol)
}

// writeEgressRules makes pol's rules (which name no domain) the egress
// rules of sandbox id's NetworkPolicy, after its group's.
func (k *Kubernetes) writeEgressRules(ctx context.Context, id string, pol egress.Policy) error {
	rules, err := egressRules(pol)
	if err != nil {
		return err
	}
	return k.changePolicy(ctx, id, func(np *networkingv1.NetworkPolicy) {
		var group []networkingv1.NetworkPolicyEgressRule
		if g := np.Labels[LabelGroup]; g != "" {
			group = []networkingv1.NetworkPolicyEgressRule{{To: groupPeers(g)}}
		}
		np.Spec.Egress = append(group, rules...)
	})
}

// JoinGroup labels sandbox id's pod and policy with group and lets its
// policy admit the group's pods both ways, and with the pods' egress
// points hands every member's point the members' addresses, then returns
// the pod's address. Joining the same group again changes nothing;
// another group is ErrConflict.
func (k *Kubernetes) JoinGroup(ctx context.Context, id, group string) (netip.Addr, error) {
	if k.opts.NoNetworkPolicy && !k.opts.EgressSidecar {
		return netip.Addr{}, errNoPolicies("sandbox groups")
	}
	if group == "" {
		return netip.Addr{}, providers.Errorf(providers.ErrInvalid, "sandbox %s: an empty group", id)
	}
	pod, err := k.pod(ctx, id)
	if err != nil {
		return netip.Addr{}, err
	}
	g := groupLabel(group)
	if had := pod.Labels[LabelGroup]; had != "" && had != g {
		return netip.Addr{}, providers.Errorf(providers.ErrConflict, "sandbox %s is in another group", id)
	}
	addr, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return netip.Addr{}, providers.Errorf(providers.ErrConflict, "sandbox %s has no address yet (pod IP %q)", id, pod.Status.PodIP)
	}
	// The policy first: a pod labelled before would be matched by the
	// other members' rules before its own admits them (harmless, but the
	// order keeps the pod's label the sign that the join is complete).
	if !k.opts.NoNetworkPolicy {
		if err := k.groupPolicy(ctx, id, g); err != nil {
			return netip.Addr{}, err
		}
	}
	if pod.Labels[LabelGroup] != g {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{LabelGroup: g}}})
		if err != nil {
			return netip.Addr{}, err
		}
		_, err = k.cs.CoreV1().Pods(k.ns).Patch(ctx, id, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case apierrors.IsForbidden(err):
			return netip.Addr{}, providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf(
				"sandbox %s: the API server refused to label its pod with its group: %s (the gateway needs patch on pods in namespace %s)",
				id, apiMessage(err), k.ns))
		case err != nil:
			return netip.Addr{}, k.kind(err, "label sandbox %s with its group", id)
		}
	}
	if k.opts.EgressSidecar {
		if err := k.refreshPeers(ctx, g, id); err != nil {
			return netip.Addr{}, err
		}
	}
	return addr, nil
}

// groupPolicy labels sandbox id's NetworkPolicy with group label g and
// gives it the group's ingress and egress rules.
func (k *Kubernetes) groupPolicy(ctx context.Context, id, g string) error {
	var other bool
	err := k.changePolicy(ctx, id, func(np *networkingv1.NetworkPolicy) {
		if had := np.Labels[LabelGroup]; had != "" && had != g {
			other = true
			return
		}
		if np.Labels == nil {
			np.Labels = map[string]string{}
		}
		np.Labels[LabelGroup] = g
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: groupPeers(g)}}
		rest := slices.DeleteFunc(slices.Clone(np.Spec.Egress), isGroupRule)
		np.Spec.Egress = append([]networkingv1.NetworkPolicyEgressRule{{To: groupPeers(g)}}, rest...)
	})
	if err != nil {
		return err
	}
	if other {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is in another group", id)
	}
	return nil
}

// groupPeers are the pods of group label g in the policy's namespace.
func groupPeers(g string) []networkingv1.NetworkPolicyPeer {
	return []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelGroup: g}}}}
}

// isGroupRule reports whether r is a group's egress rule (JoinGroup's).
func isGroupRule(r networkingv1.NetworkPolicyEgressRule) bool {
	return slices.ContainsFunc(r.To, func(p networkingv1.NetworkPolicyPeer) bool {
		return p.PodSelector != nil && p.PodSelector.MatchLabels[LabelGroup] != ""
	})
}

// policyTries bounds changePolicy's reads and patches when others change
// the policy meanwhile.
const policyTries = 8

// changePolicy applies change to sandbox id's NetworkPolicy (its labels,
// ingress and egress rules), as a merge patch conditional on the version
// change saw.
func (k *Kubernetes) changePolicy(ctx context.Context, id string, change func(*networkingv1.NetworkPolicy)) error {
	pols := k.cs.NetworkingV1().NetworkPolicies(k.ns)
	for range policyTries {
		np, err := pols.Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			return k.kind(err, "sandbox %s's network policy", id)
		}
		if np.Labels[LabelSandbox] != id {
			return providers.Errorf(providers.ErrNotFound, "sandbox %s's network policy not found", id)
		}
		change(np)
		ingress, egress := np.Spec.Ingress, np.Spec.Egress
		if ingress == nil {
			ingress = []networkingv1.NetworkPolicyIngressRule{}
		}
		if egress == nil {
			egress = []networkingv1.NetworkPolicyEgressRule{}
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": np.ResourceVersion, "labels": np.Labels},
			"spec":     map[string]any{"ingress": ingress, "egress": egress},
		})
		if err != nil {
			return err
		}
		_, err = pols.Patch(ctx, id, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err):
			continue
		case apierrors.IsForbidden(err):
			return providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf(
				"sandbox %s: the API server refused to patch its network policy: %s (the gateway needs patch on networkpolicies.networking.k8s.io in namespace %s)",
				id, apiMessage(err), k.ns))
		}
		return k.kind(err, "sandbox %s: patch its network policy", id)
	}
	return providers.Errorf(providers.ErrUnavailable, "sandbox %s: its network policy kept changing under %d patches", id, policyTries)
}

// egressRules are pol's egress rules (see above); a policy with domain
// rules is ErrUnsupported.
func egressRules(pol egress.Policy) ([]networkingv1.NetworkPolicyEgressRule, error) {
	if pol.None() {
		return nil, nil
	}
	var domains []string
	for _, r := range slices.Concat(pol.Allow, pol.Deny) {
		if r.Domain != "" {
			domains = append(domains, r.String())
		}
	}
	if len(domains) > 0 {
		return nil, providers.Errorf(providers.ErrUnsupported,
			"the kubernetes provider enforces egress with NetworkPolicies, which match addresses, not names: domain rules (%s) are not supported; CIDR rules are",
			strings.Join(domains, ", "))
	}
	var allow []netip.Prefix
	switch pol.Mode {
	case egress.ModeAll:
		allow = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	case egress.ModeRules:
		for _, r := range pol.Allow {
			allow = append(allow, r.Prefix)
		}
	default:
		return nil, providers.Errorf(providers.ErrInvalid, "egress policy mode %q", pol.Mode)
	}
	cut := egress.Reserved()
	for _, r := range pol.Deny {
		cut = append(cut, r.Prefix)
	}
	cut = outermost(cut)
	var peers []networkingv1.NetworkPolicyPeer
	for _, a := range outermost(allow) {
		if slices.ContainsFunc(cut, func(c netip.Prefix) bool { return c.Bits() <= a.Bits() && c.Contains(a.Addr()) }) {
			continue // all of a is cut
		}
		var except []string
		for _, c := range cut {
			if c.Bits() > a.Bits() && a.Contains(c.Addr()) {
				except = append(except, c.String())
			}
		}
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: a.String(), Except: except}})
	}
	if pol.Mode == egress.ModeAll && len(pol.Deny) == 0 {
		peers = append(peers, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}})
	}
	if len(peers) == 0 {
		return nil, nil
	}
	return []networkingv1.NetworkPolicyEgressRule{{To: peers}}, nil
}

// outermost are ps without the prefixes inside another of ps (and
// without repeats), v4 before v6, in address order.
func outermost(ps []netip.Prefix) []netip.Prefix {
	ps = slices.Clone(ps)
	for i, p := range ps {
		ps[i] = p.Masked()
	}
	// Shorter first among equal addresses, so a prefix's containers come
	// before it.
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), a.Bits()-b.Bits())
	})
	var out []netip.Prefix
	for _, p := range ps {
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}
