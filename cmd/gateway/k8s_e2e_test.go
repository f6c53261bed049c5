package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The gateway on --provider kubernetes, end to end: real gateway
// processes, the real test cluster (scripts/k8s/up.sh).

// startK8sGateway runs a gateway replica on the kubernetes provider: the
// given instance id and lease secret are what replicas share. When the
// test ends the instance's pods and records are removed. args are more
// flags.
func startK8sGateway(t *testing.T, stateDir, instance, secret string, args ...string) *proc {
	t.Helper()
	image := k8stest.AgentImage(t)
	t.Cleanup(func() { k8stest.RemoveInstance(t, instance) })
	return startGateway(t, stateDir, []string{"KUBECONFIG=" + k8stest.Kubeconfig()},
		append([]string{"--provider", "kubernetes", "--k8s-agent-image", image, "--k8s-namespace", k8stest.Namespace,
			"--instance-id", instance, "--lease-secret", secret}, args...)...)
}

// k8sCreate creates a sandbox of the test image through g, with the
// extra fields of members (a JSON object's members).
func k8sCreate(t *testing.T, g *proc, members ...string) dkBox {
	t.Helper()
	body := `{"image":"` + k8stest.ImageRef + `"`
	for _, m := range members {
		body += "," + m
	}
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", body+"}")
	if s != 201 {
		t.Fatalf("create: %d %s\n%s", s, b, g.stderr)
	}
	var ref struct {
		ID    string `json:"sandbox_id"`
		Token string `json:"lease_token"`
	}
	if err := json.Unmarshal(b, &ref); err != nil || ref.ID == "" {
		t.Fatalf("create: %v %s", err, b)
	}
	return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
}

// on is sb as reached through gateway g.
func (sb dkBox) on(g *proc) dkBox {
	sb.url = g.URL + "/v1/sandboxes/" + sb.id
	return sb
}

// TestKubernetesReplicas: two replicas with the same instance id and
// lease secret serve every sandbox: made on one, used and deleted on the
// other; a lease released on one is refused by the other at once; a
// replica SIGKILLed mid-traffic loses nothing.
func TestKubernetesReplicas(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	instance, secret := "k8se2e-"+strings.ToLower(rand.Text()[:8]), rand.Text()
	stateA := t.TempDir()
	a := startK8sGateway(t, stateA, instance, secret)
	b := startK8sGateway(t, t.TempDir(), instance, secret)

	sb := k8sCreate(t, a, `"ports":[8080]`)
	dkRun(t, sb.on(b), "echo made-on-a > /tmp/mark")
	// A declared port, through B's proxy (B's port-forward into the pod).
	if s, r, err := dkExec(context.Background(), sb, "echo through-the-proxy > /var/www/index.html; httpd -p 8080 -h /var/www", true); err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("httpd: %v %d %v", err, s, r)
	}
	var proxied string
	testkit.Eventually(t, "httpd through B's proxy", 20*time.Second, func() bool {
		s, body := call(t, "GET", sb.on(b).url+"/proxy/8080/index.html", "", "X-Sandbox-Lease", sb.token)
		proxied = string(body)
		return s == 200
	})
	if proxied != "through-the-proxy\n" {
		t.Fatalf("proxy on B: %q", proxied)
	}
	if got := dkRun(t, sb, "cat /tmp/mark"); got != "made-on-a\n" {
		t.Fatalf("A reads %q", got)
	}
	// Files: written through B, read through A.
	if s, body := call(t, "PUT", sb.on(b).url+"/files?path=/tmp/f.txt", "file-through-b", "X-Sandbox-Lease", sb.token); s/100 != 2 {
		t.Fatalf("PUT on B: %d %s", s, body)
	}
	if s, body := call(t, "GET", sb.url+"/files?path=/tmp/f.txt", "", "X-Sandbox-Lease", sb.token); s != 200 || string(body) != "file-through-b" {
		t.Fatalf("GET on A: %d %q", s, body)
	}
	// A gateway of another instance reconciles at its start and leaves
	// this instance's pod and record alone.
	other := startK8sGateway(t, t.TempDir(), instance+"-other", secret)
	if s, body := call(t, "GET", sb.on(other).url, "", "X-Sandbox-Lease", sb.token); s != 404 {
		t.Fatalf("another instance serves the sandbox: %d %s", s, body)
	}
	dkRun(t, sb.on(b), "true")

	// No freezer for a pod: pause is refused, clearly.
	if s, body := call(t, "POST", sb.url+"/pause", "", "X-Sandbox-Lease", sb.token); s != 409 || !strings.Contains(string(body), "not_supported") {
		t.Fatalf("pause: %d %s, want 409 not_supported", s, body)
	}
	if s, body := call(t, "POST", sb.url+"/snapshots", "", "X-Sandbox-Lease", sb.token); s != 409 || !strings.Contains(string(body), "not_supported") {
		t.Fatalf("snapshot: %d %s, want 409 not_supported", s, body)
	}
	// Listed by both.
	for _, g := range []*proc{a, b} {
		if s, body := call(t, "GET", g.URL+"/v1/sandboxes", ""); s != 200 || !strings.Contains(string(body), sb.id) {
			t.Fatalf("list on %s: %d %s", g.URL, s, body)
		}
	}

	// An operate lease OP minted on A works on B until B releases it; then A
	// refuses it at once, and CH (minted from OP on B) and CH2 (minted
	// from CH on A) with it.
	mint := func(g *proc, from string) string {
		t.Helper()
		s, body := call(t, "POST", sb.on(g).url+"/leases", `{"scope":"operate"}`, "X-Sandbox-Lease", from)
		if s != 201 {
			t.Fatalf("mint on %s: %d %s", g.URL, s, body)
		}
		var l struct {
			Token string `json:"lease_token"`
		}
		json.Unmarshal(body, &l)
		return l.Token
	}
	op := mint(a, sb.token)
	ch := mint(b, op)
	ch2 := mint(a, ch)
	opBox := sb
	opBox.token = ch2
	dkRun(t, opBox.on(b), "true")
	if s, body := call(t, "DELETE", sb.on(b).url+"/leases/release", "", "X-Sandbox-Lease", op); s != 200 {
		t.Fatalf("release on B: %d %s", s, body)
	}
	for _, tok := range []string{op, ch, ch2} {
		if s, body := call(t, "POST", sb.url+"/exec", `{"command":"true"}`, "X-Sandbox-Lease", tok); s != 401 {
			t.Fatalf("the released lease (or one minted from it) on A: %d %s, want 401", s, body)
		}
	}

	// A terminal session started on A is listed by B.
	s, body := call(t, "POST", sb.url+"/pty", `{"command":"cat"}`, "X-Sandbox-Lease", sb.token)
	if s != 201 {
		t.Fatalf("pty on A: %d %s", s, body)
	}
	var sess struct {
		ID string `json:"session_id"`
	}
	json.Unmarshal(body, &sess)
	if s, body := call(t, "GET", sb.on(b).url+"/pty", "", "X-Sandbox-Lease", sb.token); s != 200 || sess.ID == "" || !strings.Contains(string(body), sess.ID) {
		t.Fatalf("pty list on B: %d %s (session %q)", s, body, sess.ID)
	}

	// A durable command started on A is waited for, and read, on B.
	cid := startCmd(t, sb, `{"command":"sleep 2; echo made-on-a; exit 4"}`)
	if got := waitCmd(t, sb.on(b), cid); got.ExitCode == nil || *got.ExitCode != 4 {
		t.Fatalf("command started on A, waited on B: %+v", got)
	}
	if out := cmdOutput(t, sb.on(b), cid, "stdout"); out != "made-on-a\n" {
		t.Fatalf("its output on B: %q", out)
	}

	// A is SIGKILLed while both take traffic: B's calls all succeed, and a
	// new A on the same state dir serves everything.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var okB, failB atomic.Int64
	var firstErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			s, r, err := dkExec(ctx, sb.on(b), "echo b", false)
			switch {
			case ctx.Err() != nil:
			case err != nil || s != 200 || r.Stdout != "b\n":
				failB.Add(1)
				firstErr.CompareAndSwap(nil, strings.TrimSpace(r.String())+" "+errString(err)+" status "+strconv.Itoa(s))
			default:
				okB.Add(1)
			}
		}
	}()
	go func() {
		for ctx.Err() == nil {
			dkExec(ctx, sb, "echo a", false) // may fail: A dies under it
		}
	}()
	testkit.Eventually(t, "traffic on B", time.Minute, func() bool { return okB.Load() >= 5 })
	a.stop(syscall.SIGKILL)
	n := okB.Load()
	testkit.Eventually(t, "traffic on B after A died", time.Minute, func() bool { return okB.Load() >= n+10 })
	cancel()
	wg.Wait()
	if f := failB.Load(); f > 0 {
		t.Fatalf("%d of B's execs failed while A died (first: %v)", f, firstErr.Load())
	}
	sb2 := k8sCreate(t, b)
	a2 := startK8sGateway(t, stateA, instance, secret)
	dkRun(t, sb2.on(a2), "true")
	if got := dkRun(t, sb.on(a2), "cat /tmp/mark"); got != "made-on-a\n" {
		t.Fatalf("the new A reads %q", got)
	}

	// Deleted on B: gone on A.
	if s, body := call(t, "DELETE", sb.on(b).url, "", "X-Sandbox-Lease", sb.token); s != 200 {
		t.Fatalf("delete on B: %d %s", s, body)
	}
	if s, body := call(t, "GET", sb.on(a2).url, "", "X-Sandbox-Lease", sb.token); s != 404 && s != 401 {
		t.Fatalf("GET on A after the delete on B: %d %s, want 404 (or 401: its leases went with it)", s, body)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
