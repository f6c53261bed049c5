package kubernetes

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// Every sandbox pod has a NetworkPolicy of its own: labelled like the pod,
// owned by it, selecting that pod and no other pod of the namespace
// (another sandbox of this gateway or another's), with policyTypes
// Ingress and Egress and no rule, so nothing is allowed. Delete removes it
// and no other. The test cluster's CNI (a plain bridge) does not enforce
// NetworkPolicy: this checks the objects, not traffic.
func TestNetworkPolicy(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	a := create(t, p, providers.CreateSpec{Ports: []int{8080}})
	b := create(t, p, providers.CreateSpec{})
	c := create(t, newProvider(t), providers.CreateSpec{})
	cs := k8stest.Client(t)
	ctx := ctxT(t, 2*time.Minute)
	pods, err := cs.CoreV1().Pods(k8stest.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	for _, id := range []string{a, b, c} {
		pod := byName[id]
		if pod == nil {
			t.Fatalf("no pod %s", id)
		}
		pol, err := cs.NetworkingV1().NetworkPolicies(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("sandbox %s's network policy: %v", id, err)
		}
		sel, err := metav1.LabelSelectorAsSelector(&pol.Spec.PodSelector)
		if err != nil || sel.Empty() {
			t.Fatalf("policy %s: selector %v (%v), want one naming the sandbox", id, pol.Spec.PodSelector, err)
		}
		var selected []string
		for _, q := range pods.Items {
			if sel.Matches(labels.Set(q.Labels)) {
				selected = append(selected, q.Name)
			}
		}
		if !slices.Equal(selected, []string{id}) {
			t.Errorf("policy %s selects pods %v, want only %s", id, selected, id)
		}
		want := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		if !slices.Equal(pol.Spec.PolicyTypes, want) {
			t.Errorf("policy %s: policyTypes %v, want %v", id, pol.Spec.PolicyTypes, want)
		}
		if len(pol.Spec.Ingress) != 0 || len(pol.Spec.Egress) != 0 {
			t.Errorf("policy %s allows ingress %v, egress %v; want nothing", id, pol.Spec.Ingress, pol.Spec.Egress)
		}
		if !maps.Equal(pol.Labels, pod.Labels) {
			t.Errorf("policy %s labelled %v, its pod %v", id, pol.Labels, pod.Labels)
		}
		if o := pol.OwnerReferences; len(o) != 1 || o[0].Kind != "Pod" || o[0].APIVersion != "v1" || o[0].Name != id || o[0].UID != pod.UID {
			t.Errorf("policy %s owned by %v, want its pod (uid %s)", id, o, pod.UID)
		}
	}

	if err := p.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(k8stest.Namespace).Get(ctx, a, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("sandbox %s deleted, its policy: %v, want not found", a, err)
	}
	for _, id := range []string{b, c} {
		if _, err := cs.NetworkingV1().NetworkPolicies(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{}); err != nil {
			t.Errorf("sandbox %s's policy after another's delete: %v", id, err)
		}
	}
}

// With NoNetworkPolicy the pod gets none (the operator isolates pods).
func TestNoNetworkPolicy(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(o *Options) { o.NoNetworkPolicy = true })
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxT(t, time.Minute)
	if _, err := k8stest.Client(t).NetworkingV1().NetworkPolicies(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a policy with NoNetworkPolicy: %v, want not found", err)
	}
	if err := p.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
}

// leftoverPolicy makes the NetworkPolicy of a sandbox of gateway instance
// that has no pod (its gateway died between the two) and returns its
// name. It is removed at the test's end if still there.
func leftoverPolicy(t *testing.T, instance string) string {
	t.Helper()
	id := providertest.NewID()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: k8stest.Namespace, Labels: map[string]string{LabelSandbox: id, LabelInstance: instance}}}
	pols := k8stest.Client(t).NetworkingV1().NetworkPolicies(k8stest.Namespace)
	if _, err := pols.Create(ctxT(t, time.Minute), policyFor(pod), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pols.Delete(context.Background(), id, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("remove policy %s: %v", id, err)
		}
	})
	return id
}

// policyExists reports whether NetworkPolicy name is there.
func policyExists(t *testing.T, name string) bool {
	t.Helper()
	_, err := k8stest.Client(t).NetworkingV1().NetworkPolicies(k8stest.Namespace).Get(ctxT(t, time.Minute), name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// Sweep removes this instance's policies whose pod is gone and keeps a
// live sandbox's and another instance's.
func TestSweepNetworkPolicies(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	live := create(t, p, providers.CreateSpec{})
	orphan := leftoverPolicy(t, p.opts.InstanceID)
	foreign := leftoverPolicy(t, "k8stest-"+rand.Text()[:8])
	if err := p.Sweep(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	if policyExists(t, orphan) {
		t.Errorf("the orphan policy %s is still there", orphan)
	}
	if !policyExists(t, live) {
		t.Errorf("the live sandbox's policy %s was swept", live)
	}
	if !policyExists(t, foreign) {
		t.Errorf("another instance's policy %s was swept", foreign)
	}
}

// A gateway that starts sweeps: an orphan policy of its instance is gone
// once the service is up (and a pod with no record goes with its policy).
func TestNetworkPolicySweptAtStart(t *testing.T) {
	t.Parallel()
	before := newProvider(t)
	unrecorded := create(t, before, providers.CreateSpec{})
	orphan := leftoverPolicy(t, before.opts.InstanceID)
	p := newProvider(t, func(o *Options) { o.InstanceID = before.opts.InstanceID })
	svc, err := sandbox.New(ctxT(t, 2*time.Minute), sandbox.Options{
		Provider: p, StateDir: t.TempDir(), AllowAnonymous: true, ReapInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if policyExists(t, orphan) {
		t.Errorf("the orphan policy %s is still there after the start", orphan)
	}
	if policyExists(t, unrecorded) {
		t.Errorf("the policy of %s (a pod with no record, deleted at the start) is still there", unrecorded)
	}
}

// gatewayRole is the least the gateway needs in its namespace: the rules
// of the Role deploy/kubernetes applies (role.yaml, the one source; the
// README points there).
var gatewayRole = func() []rbacv1.PolicyRule {
	data, err := os.ReadFile("../../../deploy/kubernetes/role.yaml")
	if err != nil {
		panic(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		panic(fmt.Sprintf("deploy/kubernetes/role.yaml: %v", err))
	}
	role, ok := obj.(*rbacv1.Role)
	if !ok || len(role.Rules) == 0 {
		panic(fmt.Sprintf("deploy/kubernetes/role.yaml holds %T, not a Role with rules", obj))
	}
	return role.Rules
}()

// roleWith is gatewayRole with verbs on resource (none: without the rule).
func roleWith(resource string, verbs ...string) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	for _, r := range gatewayRole {
		if r.Resources[0] == resource {
			if len(verbs) == 0 {
				continue
			}
			r.Verbs = verbs
		}
		rules = append(rules, r)
	}
	return rules
}

// asRole returns the test cluster's configuration acting as a user of its
// own bound to a Role with rules (both removed at the test's end).
func asRole(t *testing.T, rules []rbacv1.PolicyRule) *rest.Config {
	t.Helper()
	cs := k8stest.Client(t)
	ctx := ctxT(t, time.Minute)
	name := "sandgate-test-" + strings.ToLower(rand.Text()[:8])
	roles, bindings := cs.RbacV1().Roles(k8stest.Namespace), cs.RbacV1().RoleBindings(k8stest.Namespace)
	if _, err := roles.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := roles.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("remove role %s: %v", name, err)
		}
	})
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
	}
	if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := bindings.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("remove role binding %s: %v", name, err)
		}
	})
	// The authorizer learns of the binding from a watch: wait until it
	// grants the Role's first verb.
	r := rules[0]
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               name,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: k8stest.Namespace, Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: r.Resources[0]},
	}}
	for {
		res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status.Allowed {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("role %s not in force within a minute", name)
		}
		poll(ctx, 50*time.Millisecond)
	}
	cfg := k8stest.RestConfig(t)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: name}
	return cfg
}

// The gateway's Role is enough for a sandbox's whole life through the
// service with its records in the cluster (create with its policy, exec,
// a port's endpoint, an egress policy, a group, delete).
func TestGatewayRole(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(o *Options) { o.RestConfig = asRole(t, gatewayRole) })
	svc, err := sandbox.New(ctxT(t, time.Minute), sandbox.Options{
		Provider: p, Store: p.Store(), StateDir: t.TempDir(), AllowAnonymous: true, ReapInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx := ctxT(t, 2*time.Minute)
	ref, err := svc.Create(ctx, sandbox.Caller{}, sandbox.CreateRequest{Image: k8stest.ImageRef, Ports: []int{8080}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	id, owner := ref.SandboxID, sandbox.Caller{Lease: ref.Token}
	if !policyExists(t, id) {
		t.Errorf("no policy for %s", id)
	}
	if res, err := svc.Exec(ctx, owner, id, sandbox.ExecRequest{Command: "echo ok"}); err != nil || string(res.Stdout) != "ok\n" {
		t.Fatalf("exec: %q, %v", res.Stdout, err)
	}
	if _, err := svc.Endpoint(ctx, owner, id, 8080); err != nil {
		t.Fatalf("endpoint: %v", err)
	}
	pol, bad := egress.NewRules([]string{"10.9.0.0/16"}, nil)
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	if _, err := svc.SetNetwork(ctx, owner, id, pol); err != nil {
		t.Fatalf("egress policy: %v", err)
	}
	if _, err := p.JoinGroup(ctx, id, "group"); err != nil {
		t.Fatalf("join a group: %v", err)
	}
	if err := svc.Delete(ctx, owner, id); err != nil {
		t.Fatal(err)
	}
	if policyExists(t, id) {
		t.Errorf("policy %s is still there after the delete", id)
	}
}

// A create the API server refuses part of fails cleanly: no pod and no
// policy are left. A Role without network policies fails before the pod,
// without patch once the pod is made (it is removed), both as unavailable
// saying what the gateway needs; without pods the policy made first is
// removed.
func TestCreateRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		rules   []rbacv1.PolicyRule
		kind    error
		mention []string
	}{
		{"no network policies", roleWith("networkpolicies"), providers.ErrUnavailable, []string{`cannot create resource "networkpolicies"`, "--k8s-network-policy=false"}},
		{"no patch of network policies", roleWith("networkpolicies", "get", "list", "create", "delete"), providers.ErrUnavailable, []string{`cannot patch resource "networkpolicies"`, "--k8s-network-policy=false"}},
		{"no create of pods", roleWith("pods", "get", "list", "watch", "delete"), providers.ErrInvalid, []string{`cannot create resource "pods"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newProvider(t, func(o *Options) { o.RestConfig = asRole(t, tc.rules) })
			id := providertest.NewID()
			start := time.Now()
			_, err := p.Create(ctxT(t, 2*time.Minute), providers.CreateSpec{ID: id, Image: k8stest.ImageRef, ReadyTimeout: time.Minute})
			if providers.Kind(err) != tc.kind {
				t.Fatalf("create: %v (kind %v), want %v", err, providers.Kind(err), tc.kind)
			}
			for _, m := range tc.mention {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("create: %v, want it to say %q", err, m)
				}
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Errorf("the refused create took %v", d)
			}
			ctx := ctxT(t, time.Minute)
			if _, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("a pod after the refused create: %v", err)
			}
			if policyExists(t, id) {
				t.Errorf("a policy after the refused create")
			}
		})
	}
}

// BenchmarkCreate: a sandbox's create (reported as create-ms) and delete,
// with its NetworkPolicy (two more API calls in the create, one in the
// delete) and without.
func BenchmarkCreate(b *testing.B) {
	for _, tc := range []struct {
		name string
		off  bool
	}{{"policy", false}, {"no-policy", true}} {
		b.Run(tc.name, func(b *testing.B) {
			p := newProvider(b, func(o *Options) { o.NoNetworkPolicy = tc.off })
			ctx := ctxT(b, 10*time.Minute)
			var creating time.Duration
			for b.Loop() {
				start := time.Now()
				id := create(b, p, providers.CreateSpec{})
				creating += time.Since(start)
				if err := p.Delete(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(creating.Milliseconds())/float64(b.N), "create-ms")
		})
	}
}
