package kubernetes

import (
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/sandbox"
)

func rules(t *testing.T, allow, deny []string) egress.Policy {
	t.Helper()
	p, bad := egress.NewRules(allow, deny)
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	return p
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// The reserved prefixes as excepts of 0.0.0.0/0 and ::/0.
var (
	reserved4 = []string{"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"}
	reserved6 = []string{"::/127", "fe80::/10", "ff00::/8"}
)

// egressShapes are policies and the peers of their one egress rule (nil:
// no rule).
func egressShapes(t *testing.T) []struct {
	name  string
	pol   egress.Policy
	peers []networkingv1.NetworkPolicyPeer
} {
	return []struct {
		name  string
		pol   egress.Policy
		peers []networkingv1.NetworkPolicyPeer
	}{
		{"none", egress.Policy{}, nil},
		{"all", egress.Policy{Mode: egress.ModeAll}, []networkingv1.NetworkPolicyPeer{
			block("0.0.0.0/0", reserved4...), block("::/0", reserved6...),
			{NamespaceSelector: &metav1.LabelSelector{}},
		}},
		// With a deny, no pod peer (it could not except the denied).
		{"all but", rules(t, []string{"*"}, []string{"10.0.0.0/8", "10.1.0.0/16", "2001:db8::/32"}), []networkingv1.NetworkPolicyPeer{
			block("0.0.0.0/0", "0.0.0.0/8", "10.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3"),
			block("::/0", "::/127", "2001:db8::/32", "fe80::/10", "ff00::/8"),
		}},
		{"cidrs", rules(t, []string{"203.0.113.0/24", "198.51.100.7", "2001:db8::/48"}, []string{"203.0.113.128/25", "198.51.100.0/24", "192.0.2.0/24"}), []networkingv1.NetworkPolicyPeer{
			// 198.51.100.7 is denied whole; 192.0.2.0/24 touches nothing.
			block("203.0.113.0/24", "203.0.113.128/25"),
			block("2001:db8::/48"),
		}},
		// Nested allows are one; reserved parts are cut, a reserved allow
		// is dropped.
		{"nested and reserved", rules(t, []string{"10.0.0.0/8", "10.2.0.0/16", "169.254.169.254", "128.0.0.0/1"}, nil), []networkingv1.NetworkPolicyPeer{
			block("10.0.0.0/8"),
			block("128.0.0.0/1", "169.254.0.0/16", "224.0.0.0/3"),
		}},
		{"everything denied", rules(t, []string{"10.0.0.0/16"}, []string{"10.0.0.0/8"}), nil},
	}
}

// Each policy shape becomes exactly its rule: allowed CIDRs as ipBlocks,
// denied and reserved prefixes as their excepts.
func TestEgressRules(t *testing.T) {
	t.Parallel()
	for _, tc := range egressShapes(t) {
		t.Run(tc.name, func(t *testing.T) {
			got, err := egressRules(tc.pol)
			if err != nil {
				t.Fatal(err)
			}
			var want []networkingv1.NetworkPolicyEgressRule
			if tc.peers != nil {
				want = []networkingv1.NetworkPolicyEgressRule{{To: tc.peers}}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("rules %+v\nwant %+v", got, want)
			}
		})
	}
	// Domains cannot be written: unsupported, naming them and saying CIDR
	// rules work.
	for _, pol := range []egress.Policy{
		rules(t, []string{"pypi.example", "10.0.0.0/8"}, nil),
		rules(t, []string{"10.0.0.0/8"}, []string{"*.pypi.example"}),
		rules(t, []string{"*"}, []string{"pypi.example"}),
	} {
		_, err := egressRules(pol)
		if !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(err.Error(), "pypi.example") || !strings.Contains(err.Error(), "CIDR rules are") {
			t.Errorf("%v: %v, want unsupported naming the domain", pol, err)
		}
	}
}

// getPolicy reads sandbox id's NetworkPolicy back.
func getPolicy(t *testing.T, id string) *networkingv1.NetworkPolicy {
	t.Helper()
	np, err := k8stest.Client(t).NetworkingV1().NetworkPolicies(k8stest.Namespace).Get(ctxT(t, time.Minute), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return np
}

// SetEgress writes each shape into the sandbox's policy as the API server
// keeps it (read back), replaces it at runtime, leaves ingress closed,
// and refuses domains leaving the policy as it was. The test cluster's
// CNI (a plain bridge) does not enforce NetworkPolicy: these are the
// objects, not traffic.
func TestSetEgress(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxT(t, 2*time.Minute)
	for _, tc := range egressShapes(t) {
		if err := p.SetEgress(ctx, id, tc.pol); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		np := getPolicy(t, id)
		var got []networkingv1.NetworkPolicyPeer
		if len(np.Spec.Egress) > 1 {
			t.Fatalf("%s: %d egress rules", tc.name, len(np.Spec.Egress))
		}
		if len(np.Spec.Egress) == 1 {
			if len(np.Spec.Egress[0].Ports) != 0 {
				t.Errorf("%s: ports %v, want all", tc.name, np.Spec.Egress[0].Ports)
			}
			got = np.Spec.Egress[0].To
		}
		if !reflect.DeepEqual(got, tc.peers) {
			t.Errorf("%s: egress peers %+v\nwant %+v", tc.name, got, tc.peers)
		}
		if len(np.Spec.Ingress) != 0 {
			t.Errorf("%s: ingress %v, want none", tc.name, np.Spec.Ingress)
		}
		want := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
		if !slices.Equal(np.Spec.PolicyTypes, want) {
			t.Errorf("%s: policyTypes %v", tc.name, np.Spec.PolicyTypes)
		}
	}
	if err := p.SetEgress(ctx, id, rules(t, []string{"10.9.0.0/16"}, nil)); err != nil {
		t.Fatal(err)
	}
	before := getPolicy(t, id)
	if err := p.SetEgress(ctx, id, rules(t, []string{"pypi.example"}, nil)); !errors.Is(err, providers.ErrUnsupported) {
		t.Fatalf("a domain rule: %v, want unsupported", err)
	}
	if after := getPolicy(t, id); after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the refused policy changed the object: %+v", after.Spec)
	}
	if err := p.SetEgress(ctx, "sb-no-such", egress.Policy{Mode: egress.ModeAll}); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("an unknown sandbox: %v, want not found", err)
	}
}

// With NoNetworkPolicy, none is fine (what the pod has) and any other
// policy or a group is unsupported.
func TestEgressNoNetworkPolicy(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(o *Options) { o.NoNetworkPolicy = true })
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxT(t, time.Minute)
	if err := p.SetEgress(ctx, id, egress.Policy{}); err != nil {
		t.Errorf("none: %v", err)
	}
	if err := p.SetEgress(ctx, id, rules(t, []string{"10.0.0.0/8"}, nil)); !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(err.Error(), "--k8s-network-policy=false") {
		t.Errorf("a CIDR policy: %v, want unsupported naming the flag", err)
	}
	if _, err := p.JoinGroup(ctx, id, "g"); !errors.Is(err, providers.ErrUnsupported) {
		t.Errorf("a group: %v, want unsupported", err)
	}
}

// selects lists the pods (of pods) a rule's peer selects in the namespace.
func selects(t *testing.T, peer networkingv1.NetworkPolicyPeer, pods []corev1.Pod) []string {
	t.Helper()
	if peer.PodSelector == nil || peer.NamespaceSelector != nil || peer.IPBlock != nil {
		t.Fatalf("peer %+v, want a pod selector alone", peer)
	}
	sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
	if err != nil || sel.Empty() {
		t.Fatalf("selector %v (%v)", peer.PodSelector, err)
	}
	var out []string
	for _, q := range pods {
		if sel.Matches(labels.Set(q.Labels)) {
			out = append(out, q.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Two sandboxes of a group have policies admitting each other (ingress
// and egress, every port) and no other pod: not a sandbox of another
// group, not an ungrouped one. JoinGroup returns the pod's address, is
// idempotent, keeps the egress rules and SetEgress keeps the group's;
// another group is a conflict. Delete takes the member out (its pod and
// policy go). Traffic is not tested: the test cluster's CNI (the plain
// bridge plugin) does not implement NetworkPolicy, and on this host no
// pod reaches another pod's IP at all (the bridge's frames pass the
// host's iptables FORWARD chain, whose policy Docker sets to DROP), so
// neither "members reach each other" nor "others do not" can be seen by
// exec here. These are the objects a NetworkPolicy-capable CNI enforces.
func TestGroups(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	a := create(t, p, providers.CreateSpec{})
	b := create(t, p, providers.CreateSpec{})
	c := create(t, p, providers.CreateSpec{})
	d := create(t, p, providers.CreateSpec{})
	ctx := ctxT(t, 2*time.Minute)
	cidr := rules(t, []string{"10.9.0.0/16"}, nil)
	if err := p.SetEgress(ctx, a, cidr); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]netip.Addr{}
	for _, j := range []struct{ id, group string }{{a, "key1/web"}, {b, "key1/web"}, {c, "key2/web"}, {a, "key1/web"}} {
		addr, err := p.JoinGroup(ctx, j.id, j.group)
		if err != nil {
			t.Fatalf("join %s to %s: %v", j.id, j.group, err)
		}
		if had, ok := addrs[j.id]; ok && had != addr {
			t.Errorf("%s rejoined at %v, was %v", j.id, addr, had)
		}
		addrs[j.id] = addr
	}
	if err := p.SetEgress(ctx, b, cidr); err != nil {
		t.Fatal(err)
	}
	if _, err := p.JoinGroup(ctx, a, "key2/web"); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("a's join to another group: %v, want conflict", err)
	}
	pods, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + p.opts.InstanceID})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range pods.Items {
		if id := q.Name; addrs[id].IsValid() && addrs[id].String() != q.Status.PodIP {
			t.Errorf("%s: JoinGroup gave %v, pod IP %s", id, addrs[id], q.Status.PodIP)
		}
	}
	web := []string{a, b}
	slices.Sort(web)
	for _, m := range []struct {
		id      string
		members []string
	}{{a, web}, {b, web}, {c, []string{c}}} {
		np := getPolicy(t, m.id)
		if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || len(np.Spec.Ingress[0].Ports) != 0 {
			t.Fatalf("%s: ingress %+v, want one rule from the group on every port", m.id, np.Spec.Ingress)
		}
		if got := selects(t, np.Spec.Ingress[0].From[0], pods.Items); !slices.Equal(got, m.members) {
			t.Errorf("%s admits %v, want %v", m.id, got, m.members)
		}
		if len(np.Spec.Egress) == 0 || len(np.Spec.Egress[0].To) != 1 || len(np.Spec.Egress[0].Ports) != 0 {
			t.Fatalf("%s: egress %+v, want the group's rule first", m.id, np.Spec.Egress)
		}
		if got := selects(t, np.Spec.Egress[0].To[0], pods.Items); !slices.Equal(got, m.members) {
			t.Errorf("%s reaches %v, want %v", m.id, got, m.members)
		}
		wantRest := 0
		if m.id != c {
			wantRest = 1 // the CIDR rule, before and after the join
		}
		if rest := np.Spec.Egress[1:]; len(rest) != wantRest || wantRest == 1 && rest[0].To[0].IPBlock.CIDR != "10.9.0.0/16" {
			t.Errorf("%s: egress rules beside the group's %+v", m.id, rest)
		}
		if np.Labels[LabelGroup] == "" {
			t.Errorf("%s: policy not labelled with the group", m.id)
		}
	}
	if np := getPolicy(t, d); len(np.Spec.Ingress)+len(np.Spec.Egress) != 0 {
		t.Errorf("the ungrouped %s: %+v, want nothing allowed", d, np.Spec)
	}
	if err := p.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	pods, err = k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + p.opts.InstanceID})
	if err != nil {
		t.Fatal(err)
	}
	if got := selects(t, getPolicy(t, a).Spec.Ingress[0].From[0], pods.Items); !slices.Equal(got, []string{a}) {
		t.Errorf("after %s's delete, %s admits %v", b, a, got)
	}
}

// groupLabel is a valid label value for any group id, and tells ids apart.
func TestGroupLabel(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, g := range []string{"", "a", "key/with spaces and ünïcode", strings.Repeat("x", 300), "A"} {
		l := groupLabel(g)
		if len(l) > 63 || strings.Trim(l, "0123456789abcdef") != "" {
			t.Errorf("%q: label %q", g, l)
		}
		if seen[l] {
			t.Errorf("%q: label %q twice", g, l)
		}
		seen[l] = true
	}
}

// capBit reports whether capability bit n is set in the hex mask.
func capBit(t *testing.T, mask string, n uint) bool {
	t.Helper()
	v, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
	if err != nil {
		t.Fatalf("mask %q: %v", mask, err)
	}
	return v&(1<<n) != 0
}

// Hostname and CapAdd land in the pod: its hostname, the sandbox
// container's added capabilities (no longer dropped), the rest of the
// security context as before, and the agent's sidecar unchanged; inside,
// the processes have them. Without them: "sandbox" and the defaults.
func TestHostnameCapAdd(t *testing.T) {
	t.Parallel()
	const netAdmin, netRaw, mknod = 12, 13, 27
	p := newProvider(t)
	ctx := ctxT(t, 2*time.Minute)
	for _, tc := range []struct {
		name, host string
		add        []string
		wantHost   string
		wantDrop   []corev1.Capability
	}{
		{"set", "web-1", []string{"NET_ADMIN", "NET_RAW"}, "web-1", []corev1.Capability{"MKNOD", "AUDIT_WRITE", "SETFCAP"}},
		{"default", "", nil, "sandbox", DefaultCapDrop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := create(t, p, providers.CreateSpec{Hostname: tc.host, CapAdd: tc.add})
			pod, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.Hostname != tc.wantHost {
				t.Errorf("hostname %q, want %q", pod.Spec.Hostname, tc.wantHost)
			}
			sec := pod.Spec.Containers[0].SecurityContext
			var add []corev1.Capability
			for _, c := range tc.add {
				add = append(add, corev1.Capability(c))
			}
			if !slices.Equal(sec.Capabilities.Add, add) || !slices.Equal(sec.Capabilities.Drop, tc.wantDrop) {
				t.Errorf("capabilities %+v, want add %v drop %v", sec.Capabilities, add, tc.wantDrop)
			}
			if sec.AllowPrivilegeEscalation == nil || *sec.AllowPrivilegeEscalation || sec.SeccompProfile == nil || sec.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("security context %+v lost its hardening", sec)
			}
			side := pod.Spec.InitContainers[0].SecurityContext.Capabilities
			if len(side.Add) != 0 || !slices.Equal(side.Drop, DefaultCapDrop) {
				t.Errorf("the agent's sidecar: %+v", side)
			}
			res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "hostname; grep CapEff /proc/self/status | cut -f2"})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec: %v, %+v", err, res)
			}
			out := strings.Fields(string(res.Stdout))
			if len(out) != 2 || out[0] != tc.wantHost {
				t.Fatalf("inside: %q", res.Stdout)
			}
			added := tc.add != nil
			if capBit(t, out[1], netAdmin) != added || capBit(t, out[1], netRaw) != added || capBit(t, out[1], mknod) {
				t.Errorf("CapEff %s: NET_ADMIN and NET_RAW %v, MKNOD never", out[1], added)
			}
		})
	}
}

// A Role without patch on pods (an older README's) makes JoinGroup
// unavailable, saying what the gateway needs.
func TestJoinGroupRefused(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	limited := newProvider(t, func(o *Options) {
		o.InstanceID = p.opts.InstanceID
		o.RestConfig = asRole(t, roleWith("pods", "get", "list", "watch", "create", "delete"))
	})
	_, err := limited.JoinGroup(ctxT(t, time.Minute), id, "g")
	if !errors.Is(err, providers.ErrUnavailable) || !strings.Contains(err.Error(), "patch on pods") {
		t.Fatalf("join: %v, want unavailable naming patch on pods", err)
	}
	pod, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctxT(t, time.Minute), id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelGroup] != "" {
		t.Errorf("pod labelled %v after the refused join", pod.Labels)
	}
}

// Through the service: a create with a CIDR policy has it in its pod's
// policy; one with a domain rule is unsupported and leaves no pod and no
// policy behind.
func TestCreateWithEgress(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	svc, err := sandbox.New(ctxT(t, time.Minute), sandbox.Options{
		Provider: p, Store: p.Store(), StateDir: t.TempDir(), AllowAnonymous: true, ReapInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx := ctxT(t, 2*time.Minute)
	pol := rules(t, []string{"10.9.0.0/16"}, nil)
	ref, err := svc.Create(ctx, sandbox.Caller{}, sandbox.CreateRequest{Image: k8stest.ImageRef, Egress: &pol})
	if err != nil {
		t.Fatal(err)
	}
	if eg := getPolicy(t, ref.SandboxID).Spec.Egress; len(eg) != 1 || eg[0].To[0].IPBlock == nil || eg[0].To[0].IPBlock.CIDR != "10.9.0.0/16" {
		t.Errorf("egress %+v, want the CIDR's rule", eg)
	}
	domain := rules(t, []string{"pypi.example"}, nil)
	_, err = svc.Create(ctx, sandbox.Caller{}, sandbox.CreateRequest{Image: k8stest.ImageRef, Egress: &domain})
	if !errors.Is(err, providers.ErrUnsupported) {
		t.Fatalf("a domain rule: %v, want unsupported", err)
	}
	pods, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + p.opts.InstanceID})
	if err != nil {
		t.Fatal(err)
	}
	pols, err := k8stest.Client(t).NetworkingV1().NetworkPolicies(k8stest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + p.opts.InstanceID})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || len(pols.Items) != 1 {
		t.Errorf("after the refused create: %d pods, %d policies; want the first sandbox's only", len(pods.Items), len(pols.Items))
	}
}

// A policy and a group stay in the cluster when the gateway goes; the
// restore of a new gateway (SetEgress and JoinGroup again) finds them as
// they were and changes nothing.
func TestEgressAcrossRestart(t *testing.T) {
	t.Parallel()
	before := newProvider(t)
	id := create(t, before, providers.CreateSpec{})
	ctx := ctxT(t, 2*time.Minute)
	pol := rules(t, []string{"10.9.0.0/16"}, []string{"10.9.1.0/24"})
	if err := before.SetEgress(ctx, id, pol); err != nil {
		t.Fatal(err)
	}
	addr, err := before.JoinGroup(ctx, id, "g")
	if err != nil {
		t.Fatal(err)
	}
	was := getPolicy(t, id)
	before.Close()
	after := newProvider(t, func(o *Options) { o.InstanceID = before.opts.InstanceID })
	if err := after.SetEgress(ctx, id, pol); err != nil {
		t.Fatal(err)
	}
	again, err := after.JoinGroup(ctx, id, "g")
	if err != nil || again != addr {
		t.Fatalf("rejoin: %v, %v; want %v", again, err, addr)
	}
	now := getPolicy(t, id)
	if !reflect.DeepEqual(now.Spec, was.Spec) || !maps.Equal(now.Labels, was.Labels) {
		t.Errorf("after the restore %+v %v\nwas %+v %v", now.Spec, now.Labels, was.Spec, was.Labels)
	}
	if len(now.Spec.Egress) != 2 || len(now.Spec.Ingress) != 1 {
		t.Errorf("egress %+v ingress %+v, want the group's rules and the CIDR's", now.Spec.Egress, now.Spec.Ingress)
	}
}
