package kubernetes

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/vishvananda/netlink"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// hostAddrs are two IPv4 addresses of the test's host (the test
// cluster's one node) that its pods reach, a packet to either being the
// host's own, never forwarded: the node's address, and another of the
// host's (docker's bridge, the pods' bridge, ...).
func hostAddrs(t *testing.T) (node, other netip.Addr) {
	t.Helper()
	nodes, err := k8stest.Client(t).CoreV1().Nodes().List(ctxT(t, time.Minute), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the test cluster's node: %v (%d nodes)", err, len(nodes.Items))
	}
	for _, a := range nodes.Items[0].Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP && ip.Is4() {
			node = ip
		}
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() != node && !ip.IsLoopback() && !other.IsValid() {
			other = ip.Unmap()
		}
	}
	if !node.IsValid() || !other.IsValid() {
		t.Fatalf("host addresses: node %v, other %v", node, other)
	}
	return node, other
}

// A sandbox's own egress point (EgressSidecar), on the test cluster's
// plain bridge CNI, which filters nothing itself (and gives pods no
// default route: the test adds one, as real CNIs have): no way out by default;
// a.test (a server of the test at the node's address) over HTTP and
// HTTPS once allowed, b.test (another address of the host) neither by name nor by
// raw IP; a CIDR rule; each change in effect when SetEgress returns,
// within a second; root in the sandbox changing resolv.conf and routes
// gains nothing; a sandbox holding NET_ADMIN gets no policy.
func TestEgressSidecar(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	aAddr, bAddr := hostAddrs(t)
	p := newProvider(t, func(o *Options) {
		o.EgressSidecar = true
		o.EgressResolve = map[string][]netip.Addr{"a.test": {aAddr}, "b.test": {bAddr}}
	})
	a, b := egresstest.ServeWho(t, aAddr), egresstest.ServeWho(t, bAddr)
	var id, capped string
	t.Cleanup(func() {
		if t.Failed() {
			// Before the provider's clean-up (registered earlier) removes the pods.
			for _, m := range []string{id, capped} {
				logs, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).GetLogs(m, &corev1.PodLogOptions{Container: containerEgress}).DoRaw(ctxT(t, time.Minute))
				t.Logf("%s's egress point (%v):\n%s", m, err, logs)
			}
		}
	})
	ctx := ctxT(t, 3*time.Minute)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); id = create(t, p, providers.CreateSpec{}) }()
	go func() { defer wg.Done(); capped = create(t, p, providers.CreateSpec{CapAdd: []string{"NET_ADMIN"}}) }()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	k8stest.DefaultRoute(t, id)
	run := func(cmd string) string {
		t.Helper()
		res, err := p.Exec(ctx, id, providers.ExecRequest{Command: cmd})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return string(res.Stdout) + string(res.Stderr)
	}
	who := func(addr string, port int, host string) string {
		t.Helper()
		return egresstest.WhoAnswer([]byte(run(egresstest.BusyboxWhoPort(false, addr, port, host))))
	}
	resolves := func(name string) bool { return strings.Contains(run("nslookup "+name), "Name:") }
	set := func(pol egress.Policy) {
		t.Helper()
		start := time.Now()
		if err := p.SetEgress(ctx, id, pol); err != nil {
			t.Fatalf("SetEgress %v: %v", pol, err)
		}
		d := time.Since(start)
		if d > time.Second {
			t.Errorf("SetEgress took %v, want under 1 s", d)
		}
		t.Logf("SetEgress %v: %v", pol, d)
	}
	aWho := "a.test " + netip.AddrPortFrom(aAddr, uint16(a.HTTP)).String()
	bRaw := bAddr.String()

	// None: no name, no address.
	if resolves("a.test") {
		t.Error("a.test resolves with policy none")
	}
	if got := who(aAddr.String(), a.HTTP, "a.test"); got != "" {
		t.Errorf("a.test's address reached with policy none: %q", got)
	}

	set(rules(t, []string{"a.test"}, nil))
	if got := who("a.test", a.HTTP, "a.test"); got != aWho {
		t.Errorf("http a.test: %q, want %q", got, aWho)
	}
	// HTTPS: the server reads the ClientHello naming a.test (busybox's TLS
	// 1.2 client and Go's server then disagree; the point's part is done).
	run(egresstest.BusyboxWhoPort(true, "a.test", a.HTTPS, "a.test"))
	if got := a.Hellos(); !slices.Contains(got, "a.test") {
		t.Errorf("https a.test: the server read hellos %q", got)
	}
	if resolves("b.test") {
		t.Error("b.test resolves")
	}
	if got := who(bRaw, b.HTTP, "b.test"); got != "" {
		t.Errorf("b.test's raw address reached: %q", got)
	}
	// Root in the sandbox (no NET_ADMIN): another nameserver in
	// resolv.conf, new routes; every port-53 packet still reaches the
	// point and every connection its proxy.
	out := run("echo nameserver " + bRaw + " > /etc/resolv.conf; ip route del default; ip route add " + bRaw + "/32 dev eth0; echo rc=$?")
	if !strings.Contains(out, "rc=") {
		t.Fatalf("resolv.conf and routes: %s", out)
	}
	if resolves("b.test") {
		t.Error("b.test resolves through another nameserver")
	}
	if got := who(bRaw, b.HTTP, "b.test"); got != "" {
		t.Errorf("b.test reached after root's changes: %q", got)
	}
	if out := run("nslookup b.test " + bRaw + " 2>&1; ping -c 1 -W 1 " + bRaw + " 2>&1; echo x | nc -u -w 1 " + bRaw + " " + strconv.Itoa(b.HTTP) + " 2>&1"); strings.Contains(out, "Name:") || strings.Contains(out, "1 packets received") {
		t.Errorf("another way out: %s", out)
	}

	// A CIDR rule, then a change back: each in effect on return.
	set(rules(t, []string{bRaw + "/32"}, nil))
	if got, want := who(bRaw, b.HTTP, "b.test"), "b.test "+netip.AddrPortFrom(bAddr, uint16(b.HTTP)).String(); got != want {
		t.Errorf("b by a CIDR rule: %q, want %q", got, want)
	}
	if resolves("a.test") {
		t.Error("a.test resolves after it left the policy")
	}
	set(rules(t, []string{"a.test"}, nil))
	if got := who(bRaw, b.HTTP, "b.test"); got != "" {
		t.Errorf("b after its CIDR left the policy: %q", got)
	}

	// NET_ADMIN would undo the rules: no policy for that sandbox, and
	// nothing changed (its point still has none).
	err := p.SetEgress(ctx, capped, rules(t, []string{"a.test"}, nil))
	if !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(err.Error(), "NET_ADMIN") {
		t.Errorf("a policy for a sandbox holding NET_ADMIN: %v, want unsupported naming it", err)
	}
	if err := p.SetEgress(ctx, capped, egress.Policy{}); err != nil {
		t.Errorf("none for a sandbox holding NET_ADMIN: %v", err)
	}

	// The pod: the point first, root with NET_ADMIN alone and a postStart
	// hook; the sandbox's container without NET_ADMIN or NET_RAW.
	pod, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pt := pod.Spec.InitContainers[0]
	if pt.Name != containerEgress || pt.Lifecycle == nil || pt.Lifecycle.PostStart == nil ||
		!slices.Equal(pt.SecurityContext.Capabilities.Add, netCaps[:1]) || len(heldNetCaps(pod)) != 0 {
		t.Errorf("the pod's containers: %+v", pod.Spec.InitContainers)
	}

	// A group: each member's point is handed the others' addresses (the
	// first member's too when the second joins), and forgets a member
	// deleted. (Pods do not reach each other on this host at all: only
	// the hand-over is seen.)
	addrs := map[string]string{}
	for _, m := range []string{id, capped} {
		a, err := p.JoinGroup(ctx, m, "g")
		if err != nil {
			t.Fatalf("join %s: %v", m, err)
		}
		addrs[m] = a.String()
	}
	if got, want := pointPeers(t, p, id), []string{addrs[capped]}; !slices.Equal(got, want) {
		t.Errorf("%s's peers %v, want %v", id, got, want)
	}
	if got, want := pointPeers(t, p, capped), []string{addrs[id]}; !slices.Equal(got, want) {
		t.Errorf("%s's peers %v, want %v", capped, got, want)
	}
	if err := p.Delete(ctx, capped); err != nil {
		t.Fatal(err)
	}
	if got := pointPeers(t, p, id); len(got) != 0 {
		t.Errorf("%s's peers after the other's delete: %v", id, got)
	}
}

// pointPeers are the group peers sandbox id's point holds.
func pointPeers(t *testing.T, p *Kubernetes, id string) []string {
	t.Helper()
	ex, err := p.executor(id, containerEgress, []string{egressBin, "show", "--dir", egressDir})
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := ex.StreamWithContext(ctxT(t, time.Minute), remotecommand.StreamOptions{Stdin: strings.NewReader(""), Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatalf("show %s's point: %v %s", id, err, errOut.String())
	}
	var st struct{ Peers []string }
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("%s's point's state %q: %v", id, out.String(), err)
	}
	return st.Peers
}

// The pod's shape with EgressSidecar (no cluster needed): the point in
// the agent's sidecar's place, as root with NET_ADMIN alone, installing
// the agent, its postStart hook waiting for its rules, its volume its
// own; the sandbox's container as without it. Domain rules pass CheckEgress; the NetworkPolicy
// of a policy naming domains lets everything out, one of CIDRs those.
func TestEgressSidecarPod(t *testing.T) {
	t.Parallel()
	k := &Kubernetes{opts: Options{AgentImage: "agent:1", EgressSidecar: true,
		EgressResolve: map[string][]netip.Addr{"b.test": {netip.MustParseAddr("192.0.2.2")}, "a.test": {netip.MustParseAddr("192.0.2.1")}}}, ns: "ns"}
	plain := &Kubernetes{opts: Options{AgentImage: "agent:1"}, ns: "ns"}
	spec := providers.CreateSpec{ID: "sbx-1", Image: "img"}
	pod, _, err := k.podFor(spec, "/")
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := plain.podFor(spec, "/")
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 || !reflect.DeepEqual(pod.Spec.Containers, want.Spec.Containers) {
		t.Fatalf("containers %+v\nwant the point alone in the agent's sidecar's place", pod.Spec.InitContainers)
	}
	pt := pod.Spec.InitContainers[0]
	sec := pt.SecurityContext
	if pt.Name != containerEgress || pt.Image != "agent:1" || pt.RestartPolicy == nil || *pt.RestartPolicy != corev1.ContainerRestartPolicyAlways ||
		*sec.RunAsUser != 0 || *sec.AllowPrivilegeEscalation || !*sec.ReadOnlyRootFilesystem ||
		!slices.Equal(sec.Capabilities.Add, []corev1.Capability{"NET_ADMIN"}) || !slices.Equal(sec.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the point: %+v", pt)
	}
	if want := []string{egressBin, "serve", "--dir", egressDir, "--install-agent", agentBin, "--resolve", "a.test=192.0.2.1,b.test=192.0.2.2"}; !slices.Equal(pt.Command, want) {
		t.Errorf("command %q, want %q", pt.Command, want)
	}
	if h := pt.Lifecycle.PostStart.Exec; h == nil || !slices.Equal(h.Command, []string{egressBin, "ready", "--dir", egressDir}) {
		t.Errorf("postStart %+v", pt.Lifecycle.PostStart)
	}
	if got, want := pt.VolumeMounts, []corev1.VolumeMount{{Name: containerEgress, MountPath: egressDir}, {Name: containerAgent, MountPath: agentDir}}; !reflect.DeepEqual(got, want) {
		t.Errorf("the point mounts %+v, want %+v", got, want)
	}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if m.Name == containerEgress {
			t.Errorf("the sandbox mounts the point's volume")
		}
	}

	if err := k.CheckEgress(rules(t, []string{"pypi.example"}, nil)); err != nil {
		t.Errorf("a domain rule with the sidecar: %v", err)
	}
	if got := policyForNetpol(rules(t, []string{"10.0.0.0/8"}, []string{"*.example"})); got.Mode != egress.ModeAll || len(got.Deny) != 0 {
		t.Errorf("the NetworkPolicy of a policy naming a domain: %+v, want all", got)
	}
	cidrs := rules(t, []string{"10.0.0.0/8"}, []string{"10.1.0.0/16"})
	if got := policyForNetpol(cidrs); !reflect.DeepEqual(got, cidrs) {
		t.Errorf("the NetworkPolicy of CIDRs: %+v, want them", got)
	}
	capped, _, err := plain.podFor(providers.CreateSpec{ID: "sbx-2", Image: "img", CapAdd: []string{"NET_RAW", "SYS_TIME"}}, "/")
	if err != nil {
		t.Fatal(err)
	}
	if got := heldNetCaps(capped); !slices.Equal(got, []string{"NET_RAW"}) {
		t.Errorf("held %v, want NET_RAW", got)
	}
}

// Through the service with EgressSidecar: a create with a domain rule has
// it in force when create returns (its point answers a.test, not b.test);
// one adding NET_ADMIN with a policy is unsupported and leaves no pod.
func TestCreateWithEgressSidecar(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	p := newProvider(t, func(o *Options) {
		o.EgressSidecar = true
		o.EgressResolve = map[string][]netip.Addr{"a.test": {netip.MustParseAddr("192.0.2.1")}, "b.test": {netip.MustParseAddr("192.0.2.2")}}
	})
	svc, err := sandbox.New(ctxT(t, time.Minute), sandbox.Options{
		Provider: p, Store: p.Store(), StateDir: t.TempDir(), AllowAnonymous: true, ReapInterval: time.Hour,
		CapAddAllow: []string{"NET_ADMIN"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	ctx := ctxT(t, 2*time.Minute)
	pol := rules(t, []string{"a.test"}, nil)
	ref, err := svc.Create(ctx, sandbox.Caller{}, sandbox.CreateRequest{Image: k8stest.ImageRef, Egress: &pol})
	if err != nil {
		t.Fatal(err)
	}
	// Any nameserver the pod routes to (this cluster gives pods no
	// default route: the bridge's gateway is one) reaches its point.
	pod, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctx, ref.SandboxID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := netip.MustParseAddr(pod.Status.PodIP).As4()
	ns[3] = 1
	res, err := p.Exec(ctx, ref.SandboxID, providers.ExecRequest{Command: "nslookup a.test " + netip.AddrFrom4(ns).String() + "; nslookup b.test " + netip.AddrFrom4(ns).String()})
	if err != nil {
		t.Fatal(err)
	}
	if out := string(res.Stdout); !strings.Contains(out, "Address: 192.0.2.1") || strings.Contains(out, "192.0.2.2") {
		t.Errorf("a.test and b.test from the new sandbox: %s", out)
	}
	_, err = svc.Create(ctx, sandbox.Caller{}, sandbox.CreateRequest{Image: k8stest.ImageRef, Egress: &pol, CapAdd: []string{"NET_ADMIN"}})
	if !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(err.Error(), "NET_ADMIN") {
		t.Fatalf("NET_ADMIN with a policy: %v, want unsupported naming it", err)
	}
	pods, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + p.opts.InstanceID})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 {
		t.Errorf("after the refused create: %d pods, want the first sandbox's only", len(pods.Items))
	}
}
