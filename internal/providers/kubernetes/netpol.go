package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/providers"
)

// Every sandbox pod gets a NetworkPolicy of its own (unless
// Options.NoNetworkPolicy), named like the pod and labelled like it, that
// selects that pod alone (both its labels) and allows nothing: no
// ingress, no egress.
//
// No ingress rule is needed by the gateway: it reaches the agent through
// the pod's exec subresource and a declared port through port-forward,
// both of which the kubelet serves by entering the pod's network
// namespace and dialling loopback, which no NetworkPolicy filters. So
// other sandboxes, other pods and the nodes' addresses are refused.
//
// No egress either, as the local and docker providers' default (network
// none): it reaches neither the API server nor cluster services (DNS
// included: it has nothing to resolve) nor other sandboxes nor the
// internet, until an egress policy or a group adds rules (egress.go).
// Replies to allowed traffic need no rule (policies are stateful).
//
// The policy is made before the pod, so the pod is never selected by
// nothing, then owned by the pod once the pod exists (the cluster's
// garbage collector removes it with the pod). Delete removes it
// explicitly too, and Sweep removes one whose pod is gone (a gateway that
// died between the two calls).
//
// The objects are what the gateway controls: the traffic is filtered only
// where the cluster's CNI implements NetworkPolicy (Calico, Cilium, ...;
// a plain bridge or flannel ignores them).

// policyFor is the NetworkPolicy of sandbox pod.
func policyFor(pod *corev1.Pod) *networkingv1.NetworkPolicy {
	sel := map[string]string{LabelSandbox: pod.Labels[LabelSandbox], LabelInstance: pod.Labels[LabelInstance]}
	labels := make(map[string]string, len(pod.Labels))
	for k, v := range pod.Labels {
		labels[k] = v
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Labels: labels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			// Both rule lists empty: nothing is allowed either way.
		},
	}
}

// createPolicy makes pod's NetworkPolicy (before the pod: see above).
func (k *Kubernetes) createPolicy(ctx context.Context, pod *corev1.Pod) error {
	_, err := k.cs.NetworkingV1().NetworkPolicies(k.ns).Create(ctx, policyFor(pod), metav1.CreateOptions{})
	return k.policyErr(err, pod.Name, "make")
}

// ownPolicy makes pod the owner of its NetworkPolicy. It fails when the
// policy is gone (Sweep on another replica took it before the pod
// existed): the create then fails rather than run a pod no policy selects.
func (k *Kubernetes) ownPolicy(ctx context.Context, pod *corev1.Pod) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"ownerReferences": []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}},
	}})
	if err != nil {
		return err
	}
	_, err = k.cs.NetworkingV1().NetworkPolicies(k.ns).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return k.policyErr(err, pod.Name, "own")
}

// policyErr is err (nil stays nil) of a create's call that would what
// sandbox id's NetworkPolicy. A refusal (no permission, a webhook) is
// ErrUnavailable naming what the gateway needs: no create can succeed
// until the operator acts.
func (k *Kubernetes) policyErr(err error, id, what string) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf(
			"create sandbox %s: the API server refused to %s its network policy: %s (the gateway needs get, list, create, patch and delete on networkpolicies.networking.k8s.io in namespace %s; or --k8s-network-policy=false where the cluster's operator isolates pods)",
			id, what, apiMessage(err), k.ns))
	}
	return k.kind(err, "create sandbox %s: %s its network policy", id, what)
}

// deletePolicy removes sandbox id's NetworkPolicy; one already gone is
// no error.
func (k *Kubernetes) deletePolicy(ctx context.Context, id string) error {
	err := k.cs.NetworkingV1().NetworkPolicies(k.ns).Delete(ctx, id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return k.kind(err, "delete sandbox %s's network policy", id)
	}
	return nil
}

// Sweep removes this instance's NetworkPolicies whose pod is gone (a
// gateway that died between making a policy and its pod, or a cluster
// whose garbage collector has not caught up). Other replicas may be
// creating meanwhile: the policies are listed before the pods, and each
// is deleted only if unchanged since (its resourceVersion): a policy
// whose pod appeared after the pods were listed has since been given
// its owner, so its delete is refused; one deleted before that makes its
// create fail (ownPolicy), never leaves a pod unselected.
func (k *Kubernetes) Sweep(ctx context.Context) error {
	if k.opts.NoNetworkPolicy {
		return nil
	}
	sel := metav1.ListOptions{LabelSelector: LabelInstance + "=" + k.opts.InstanceID + "," + LabelSandbox}
	pols, err := k.cs.NetworkingV1().NetworkPolicies(k.ns).List(ctx, sel)
	if err != nil {
		return k.kind(err, "list network policies")
	}
	if len(pols.Items) == 0 {
		return nil
	}
	pods, err := k.cs.CoreV1().Pods(k.ns).List(ctx, sel)
	if err != nil {
		return k.kind(err, "list sandboxes")
	}
	live := make(map[string]bool, len(pods.Items))
	for _, p := range pods.Items {
		live[p.Name] = true
	}
	for _, pol := range pols.Items {
		if live[pol.Name] {
			continue
		}
		err := k.cs.NetworkingV1().NetworkPolicies(k.ns).Delete(ctx, pol.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &pol.UID, ResourceVersion: &pol.ResourceVersion},
		})
		switch {
		case err == nil:
			k.log.Info("deleted the network policy of a sandbox that is gone", "sandbox", pol.Name)
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone already, or given its pod meanwhile.
		default:
			return k.kind(err, "delete network policy %s", pol.Name)
		}
	}
	return nil
}
