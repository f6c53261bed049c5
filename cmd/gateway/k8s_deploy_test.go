package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The gateway deployed into the test cluster by deploy/kubernetes (the
// README's Kubernetes quick start): its image and the agent's loaded into
// the node's containerd, the kustomization applied under namespaces of the
// test's own, the Service reached from outside through kubectl
// port-forward, and one of the two replicas deleted mid-traffic.

// k8sBin is the test cluster's directory of binaries (kubectl).
func k8sBin() string {
	return filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(k8stest.Kubeconfig()))), "bin-v1.37.2")
}

// kubectlCmd is the test cluster's kubectl with args.
func kubectlCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(k8sBin(), "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k8stest.Kubeconfig())
	return cmd
}

// kubectlT runs kubectl with args, failing t on an error, and returns its
// output.
func kubectlT(t *testing.T, stdin io.Reader, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := kubectlCmd(ctx, args...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// loadGatewayImage puts the docker image into the test cluster's
// containerd, as the README tells a user to (docker save | ctr images
// import).
func loadGatewayImage(t *testing.T, image string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	save := exec.CommandContext(ctx, "docker", "save", image)
	imp := exec.CommandContext(ctx, "ctr", "-a", filepath.Join(filepath.Dir(filepath.Dir(k8stest.Kubeconfig())), "containerd/containerd.sock"),
		"-n", "k8s.io", "images", "import", "-")
	pipe, err := save.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	imp.Stdin = pipe
	var saveErr, impOut bytes.Buffer
	save.Stderr, imp.Stdout, imp.Stderr = &saveErr, &impOut, &impOut
	if err := save.Start(); err != nil {
		t.Fatal(err)
	}
	ierr := imp.Run()
	serr := save.Wait()
	if serr != nil || ierr != nil {
		t.Fatalf("docker save %s | ctr images import: %v %v\n%s%s", image, serr, ierr, saveErr.Bytes(), impOut.Bytes())
	}
}

// apiRelay stands in for the cluster's `kubernetes` Service, which the
// test cluster cannot route (it has no kube-proxy, and its API server
// listens on 127.0.0.1 only): it listens on the pod bridge's host address
// and forwards to the API server, for the gateway pods of namespace ns
// alone. The gateway reaches it with the service account's own token and
// CA (a kubeconfig naming them), so its Role is what authorizes it.
type apiRelay struct {
	ln    net.Listener
	addr  string
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startAPIRelay(t *testing.T, bridgeIP, ns string) *apiRelay {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(bridgeIP, "0"))
	if err != nil {
		t.Fatal(err)
	}
	cs := k8stest.Client(t)
	r := &apiRelay{ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	// allowed: is ip a pod of ns?
	allowed := func(ip string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, p := range pods.Items {
			if p.Status.PodIP == ip {
				return true
			}
		}
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r.track(c, true)
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				defer r.track(c, false)
				host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
				if !allowed(host) {
					return
				}
				up, err := net.DialTimeout("tcp", "127.0.0.1:6443", 10*time.Second)
				if err != nil {
					return
				}
				r.track(up, true)
				defer r.track(up, false)
				done := make(chan struct{}, 2)
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				go func() { io.Copy(c, up); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
				<-done
				<-done
			}()
		}
	}()
	return r
}

// track adds c to the open connections, or closes and removes it.
func (r *apiRelay) track(c net.Conn, open bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if open {
		r.conns[c] = true
		return
	}
	c.Close()
	delete(r.conns, c)
}

// close stops listening, closes the relayed connections and waits for
// their goroutines.
func (r *apiRelay) close() {
	r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// portForward is `kubectl port-forward` of a Service or pod (target)
// port to 127.0.0.1, started again when it ends (its pod went away).
type portForward struct {
	ns     string
	target string
	port   string

	mu   sync.Mutex
	url  string
	cmd  *exec.Cmd
	dead chan struct{} // closed when cmd ended
}

var forwardingRe = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) ->`)

func newPortForward(t *testing.T, ns, target, port string) *portForward {
	pf := &portForward{ns: ns, target: target, port: port}
	t.Cleanup(pf.stop)
	return pf
}

// URL is the base URL of a running port-forward; old, when not "", is a
// URL the caller found broken: a new port-forward is started unless one
// already replaced it.
func (pf *portForward) URL(old string) (string, error) {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if pf.cmd != nil {
		select {
		case <-pf.dead:
		default:
			if old == "" || old != pf.url {
				return pf.url, nil
			}
			pf.cmd.Process.Kill()
			<-pf.dead
		}
	}
	cmd := kubectlCmd(context.Background(), "-n", pf.ns, "port-forward", "--address", "127.0.0.1", pf.target, ":"+pf.port)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	dead := make(chan struct{})
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := forwardingRe.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case port <- m[1]:
				default:
				}
			}
		}
		cmd.Wait()
		close(dead)
	}()
	select {
	case p := <-port:
		pf.cmd, pf.dead, pf.url = cmd, dead, "http://127.0.0.1:"+p
		return pf.url, nil
	case <-dead:
		return "", fmt.Errorf("kubectl port-forward %s ended: %s", pf.target, stderr.String())
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-dead
		return "", fmt.Errorf("kubectl port-forward %s: no port within a minute: %s", pf.target, stderr.String())
	}
}

func (pf *portForward) stop() {
	pf.mu.Lock()
	defer pf.mu.Unlock()
	if pf.cmd != nil {
		pf.cmd.Process.Kill()
		<-pf.dead
	}
}

// deployClient is the HTTP client of the deployment test; its idle
// connections are closed at the test's end.
var deployClient = &http.Client{Transport: &http.Transport{}}

// deployCall is one request through pf: status, body, and an error for a
// request that got no answer (then pf is replaced).
func deployCall(ctx context.Context, pf *portForward, method, path, body string, hdr ...string) (int, []byte, error) {
	base, err := pf.URL("")
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := deployClient.Do(req)
	if err == nil {
		var data []byte
		data, err = io.ReadAll(res.Body)
		res.Body.Close()
		if err == nil {
			return res.StatusCode, data, nil
		}
	}
	pf.URL(base)
	return 0, nil, err
}

// TestKubernetesDeployment applies deploy/kubernetes to the test cluster
// (the gateway's and the agent's images loaded into its containerd) and
// drives it through its Service from outside: create, exec, then one of
// the two replicas deleted while execs and creates run. Every request
// either succeeds or fails cleanly (no answer, or a 5xx) and succeeds when
// retried; the sandbox made before is served with its lease by the other
// replica.
func TestKubernetesDeployment(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	requireDockerCLI(t)
	agentImage := k8stest.AgentImage(t)
	gwImage, err := waitGatewayImage()
	if err != nil {
		t.Fatalf("build the gateway image: %v", err)
	}
	loadGatewayImage(t, gwImage)
	t.Cleanup(deployClient.CloseIdleConnections)

	suffix := strings.ToLower(rand.Text()[:8])
	gwNS, sbNS := "sgdeploy-"+suffix, "sgdeploy-sb-"+suffix
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		kubectlCmd(ctx, "-n", sbNS, "delete", "pods", "--all", "--grace-period=0", "--force").Run()
		if out, err := kubectlCmd(ctx, "delete", "namespace", gwNS, sbNS, "--ignore-not-found", "--timeout=2m").CombinedOutput(); err != nil {
			t.Errorf("delete the test's namespaces: %v\n%s", err, out)
		}
	})

	// The pod bridge exists once a pod has run on the node: a pause pod
	// of the test's own makes sure.
	bridgePod := "sgdeploy-bridge-" + suffix
	t.Cleanup(func() {
		kubectlCmd(context.Background(), "-n", "default", "delete", "pod", bridgePod, "--ignore-not-found", "--grace-period=0", "--force").Run()
	})
	bridgeIP := ""
	testkit.EventuallyNil(t, "the pod bridge k8stest0", 2*time.Minute, func() error {
		if ip, err := interfaceIPv4("k8stest0"); err == nil {
			bridgeIP = ip
			return nil
		}
		if kubectlCmd(context.Background(), "-n", "default", "get", "pod", bridgePod).Run() != nil {
			kubectlT(t, nil, "-n", "default", "run", bridgePod, "--image=k8s-test.local/pause:1", "--restart=Never", "--image-pull-policy=Never")
		}
		return errors.New("no k8stest0 yet")
	})
	relay := startAPIRelay(t, bridgeIP, gwNS)
	t.Cleanup(relay.close)
	_, relayPort, _ := net.SplitHostPort(relay.addr)

	// The overlay: the test's images and namespaces, and the relay's
	// kubeconfig.
	base, err := filepath.Abs("../../deploy/kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(gwImage, ":")
	aname, atag, _ := strings.Cut(agentImage, ":")
	kubeconfig := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://` + net.JoinHostPort(bridgeIP, relayPort) + `
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    tls-server-name: kubernetes.default.svc
users:
- name: u
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`
	kust := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ` + rel + `
  - relay.yaml
images:
  - name: sandgate/gateway
    newName: ` + name + `
    newTag: "` + tag + `"
  - name: sandgate.local/sandgate-agent
    newName: ` + aname + `
    newTag: "` + atag + `"
patches:
  - patch: |
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: sandgate-gateway, namespace: sandgate}
      spec:
        template:
          spec:
            containers:
              - name: gateway
                imagePullPolicy: Never
                env:
                  - {name: SANDGATE_K8S_NAMESPACE, value: ` + sbNS + `}
                  - {name: KUBECONFIG, value: /etc/sandgate-relay/kubeconfig}
                volumeMounts:
                  - {name: relay, mountPath: /etc/sandgate-relay}
            volumes:
              - name: relay
                configMap: {name: sandgate-relay}
  - target: {kind: Namespace, name: sandgate}
    patch: '[{"op": "replace", "path": "/metadata/name", "value": "` + gwNS + `"}]'
  - target: {kind: Namespace, name: sandgate-sandboxes}
    patch: '[{"op": "replace", "path": "/metadata/name", "value": "` + sbNS + `"}]'
  - target: {kind: RoleBinding}
    patch: '[{"op": "replace", "path": "/subjects/0/namespace", "value": "` + gwNS + `"}]'
  - target: {namespace: sandgate}
    patch: '[{"op": "replace", "path": "/metadata/namespace", "value": "` + gwNS + `"}]'
  - target: {namespace: sandgate-sandboxes}
    patch: '[{"op": "replace", "path": "/metadata/namespace", "value": "` + sbNS + `"}]'
`
	relayCM, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "sandgate-relay", "namespace": "sandgate"}, "data": map[string]string{"kubeconfig": kubeconfig}})
	for f, data := range map[string]string{"kustomization.yaml": kust, "relay.yaml": string(relayCM)} {
		if err := os.WriteFile(filepath.Join(overlay, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The README's steps 3 and 4 (its kubectl commands, with the test's
	// namespace and overlay): the namespace, the Secret, apply, wait for
	// the rollout, read the API key.
	steps := readmeQuickStart(t)
	kubectl := `kubectl() { local a=(); for x in "$@"; do case $x in sandgate) x=$GWNS;; deploy/kubernetes) x=$OVERLAY;; esac; a+=("$x"); done; command "$KUBECTL" "${a[@]}"; }`
	runCtx, runCancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer runCancel()
	run := exec.CommandContext(runCtx, "bash", "-euo", "pipefail", "-c", kubectl+"\n"+steps+"\necho \"$KEY\"")
	run.Env = append(os.Environ(), "KUBECONFIG="+k8stest.Kubeconfig(), "KUBECTL="+filepath.Join(k8sBin(), "kubectl"), "GWNS="+gwNS, "OVERLAY="+overlay)
	var runErr bytes.Buffer
	run.Stderr = &runErr
	out, err := run.Output()
	if err != nil {
		logs, _ := kubectlCmd(context.Background(), "-n", gwNS, "logs", "-l", "app.kubernetes.io/name=sandgate-gateway", "--tail=30").CombinedOutput()
		desc, _ := kubectlCmd(context.Background(), "-n", gwNS, "describe", "pods").CombinedOutput()
		t.Fatalf("the README's steps:\n%s\n%v\n%s%s\nlogs:\n%s\n%s", steps, err, out, runErr.Bytes(), logs, desc)
	}
	outLines := strings.Split(strings.TrimSpace(string(out)), "\n")
	apiKey := outLines[len(outLines)-1]
	if len(apiKey) < 16 {
		t.Fatalf("the README's steps made the API key %q", apiKey)
	}
	pods := gatewayPods(t, gwNS)
	if len(pods) != 2 {
		t.Fatalf("gateway pods %v, want 2", pods)
	}

	svc := newPortForward(t, gwNS, "svc/sandgate-gateway", "80")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	auth := []string{"Authorization", "Bearer " + apiKey}
	// Without the key: refused.
	if s, body, err := deployCall(ctx, svc, "POST", "/v1/sandboxes", `{"image":"`+k8stest.ImageRef+`"}`); err != nil || s != 401 {
		t.Fatalf("create without the API key: %d %s %v, want 401", s, body, err)
	}
	sb := deployCreate(t, ctx, svc, auth)
	if out := deployExec(t, ctx, svc, sb, "echo made-before > /tmp/mark; echo $((6*7))"); out != "42\n" {
		t.Fatalf("first exec: %q", out)
	}
	// A sandbox cannot use the relay to the API server (only the gateway
	// pods may): its connection is closed with no answer, where the API
	// server would answer an HTTP request with a 400.
	if out := deployExec(t, ctx, svc, sb, `printf 'GET /version HTTP/1.0\r\n\r\n' | nc -w 5 `+bridgeIP+` `+relayPort+`; echo "nc-exit=$?"`); out != "nc-exit=0\n" {
		t.Fatalf("a sandbox reached the API server through the test's relay: %q", out)
	}

	// The replica the port-forward reaches served that exec: delete it
	// while execs and creates run.
	var served string
	for _, p := range pods {
		if strings.Contains(kubectlT(t, nil, "-n", gwNS, "logs", p), "/exec") {
			served = p
		}
	}
	if served == "" {
		t.Fatalf("no gateway pod logged the exec")
	}
	other := pods[0]
	if other == served {
		other = pods[1]
	}

	tctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var execs, creates, retried atomic.Int64
	var lost atomic.Value
	made := make(chan deployBox, 100)
	// retry runs op until it succeeds; a failure must be clean (no
	// answer, or 5xx/503), anything else is lost.
	retry := func(what string, op func() (int, []byte, error, bool)) bool {
		for i := 0; tctx.Err() == nil; i++ {
			s, body, err, ok := op()
			if ok {
				if i > 0 {
					retried.Add(1)
				}
				return true
			}
			if tctx.Err() != nil {
				return false
			}
			if err == nil && s < 500 {
				lost.CompareAndSwap(nil, fmt.Sprintf("%s: %d %s", what, s, body))
				return false
			}
			if i > 50 {
				lost.CompareAndSwap(nil, fmt.Sprintf("%s: no success in 50 retries: %d %s %v", what, s, body, err))
				return false
			}
			// A retry's pause (not a wait for a condition).
			select {
			case <-tctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		return false
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		for n := 0; tctx.Err() == nil; n++ {
			want := fmt.Sprintf("exec-%d\n", n)
			if retry("exec", func() (int, []byte, error, bool) {
				s, body, err := deployCall(tctx, svc, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"command":"echo exec-`+fmt.Sprint(n)+`"}`, "X-Sandbox-Lease", sb.Token)
				return s, body, err, err == nil && s == 200 && strings.Contains(string(body), `"stdout":`+jsonString(want))
			}) {
				execs.Add(1)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for tctx.Err() == nil {
			var b deployBox
			if retry("create", func() (int, []byte, error, bool) {
				s, body, err := deployCall(tctx, svc, "POST", "/v1/sandboxes", `{"image":"`+k8stest.ImageRef+`"}`, auth...)
				ok := err == nil && s == 201 && json.Unmarshal(body, &b) == nil && b.ID != ""
				return s, body, err, ok
			}) && retry("exec in a new sandbox", func() (int, []byte, error, bool) {
				s, body, err := deployCall(tctx, svc, "POST", "/v1/sandboxes/"+b.ID+"/exec", `{"command":"echo new"}`, "X-Sandbox-Lease", b.Token)
				return s, body, err, err == nil && s == 200 && strings.Contains(string(body), `"stdout":"new\n"`)
			}) {
				creates.Add(1)
				made <- b
			}
		}
	}()
	testkit.Eventually(t, "traffic through the Service", 2*time.Minute, func() bool { return execs.Load() >= 5 && creates.Load() >= 1 })
	kubectlT(t, nil, "-n", gwNS, "delete", "pod", served, "--wait=false")
	e, c := execs.Load(), creates.Load()
	testkit.Eventually(t, "traffic after the replica's deletion", 3*time.Minute, func() bool {
		return lost.Load() != nil || (execs.Load() >= e+10 && creates.Load() >= c+2)
	})
	stop()
	wg.Wait()
	close(made)
	if l := lost.Load(); l != nil {
		t.Fatalf("a request lost while replica %s went away: %v", served, l)
	}
	t.Logf("%d execs and %d creates through the Service; %d succeeded on a retry after %s was deleted", execs.Load(), creates.Load(), retried.Load(), served)

	// The other replica, reached directly, serves the first sandbox with
	// its lease, and the ones made during the deletion.
	direct := newPortForward(t, gwNS, "pod/"+other, "8080")
	if out := deployExec(t, ctx, direct, sb, "cat /tmp/mark"); out != "made-before\n" {
		t.Fatalf("the first sandbox through %s: %q", other, out)
	}
	for b := range made {
		if s, body, err := deployCall(ctx, direct, "DELETE", "/v1/sandboxes/"+b.ID, "", "X-Sandbox-Lease", b.Token); err != nil || s != 200 {
			t.Fatalf("delete %s through %s: %d %s %v", b.ID, other, s, body, err)
		}
	}
	if s, body, err := deployCall(ctx, direct, "DELETE", "/v1/sandboxes/"+sb.ID, "", "X-Sandbox-Lease", sb.Token); err != nil || s != 200 {
		t.Fatalf("delete the first sandbox: %d %s %v", s, body, err)
	}

	// The Deployment replaced the deleted replica: two ready again, and
	// the PodDisruptionBudget allows one of them to go.
	if out, err := kubectlCmd(ctx, "-n", gwNS, "rollout", "status", "deployment/sandgate-gateway", "--timeout=2m").CombinedOutput(); err != nil {
		t.Fatalf("the replica replaced: %v\n%s", err, out)
	}
	testkit.Eventually(t, "the PodDisruptionBudget allowing one disruption", time.Minute, func() bool {
		return kubectlT(t, nil, "-n", gwNS, "get", "pdb", "sandgate-gateway", "-o", "jsonpath={.status.disruptionsAllowed}") == "1"
	})
}

// readmeQuickStart is the README's Kubernetes quick start block from its
// step 3 up to its port-forward, with the KEY=... line of step 4: the
// cluster-side commands the test runs as they are written.
func readmeQuickStart(t *testing.T) string {
	t.Helper()
	doc := readme(t)
	i := strings.Index(doc, "\n### Kubernetes quick start\n")
	if i < 0 {
		t.Fatal("README has no Kubernetes quick start")
	}
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(doc[i:])
	if m == nil {
		t.Fatal("no sh block in the README's Kubernetes quick start")
	}
	block := m[1]
	a, b := strings.Index(block, "\n# 3."), strings.Index(block, "\n# 4.")
	if a < 0 || b < a {
		t.Fatalf("the quick start has no steps 3 and 4:\n%s", block)
	}
	steps := block[a:b]
	key := regexp.MustCompile(`(?m)^KEY=.*$`).FindString(block[b:])
	for _, want := range []string{"kubectl apply -k deploy/kubernetes", "create secret generic sandgate-gateway", "rollout status deployment/sandgate-gateway"} {
		if !strings.Contains(steps, want) {
			t.Fatalf("the quick start's step 3 lacks %q:\n%s", want, steps)
		}
	}
	if key == "" || !strings.Contains(block[b:], "port-forward --address 127.0.0.1 svc/sandgate-gateway 8080:80") {
		t.Fatalf("the quick start's step 4 lacks the port-forward or the KEY line:\n%s", block[b:])
	}
	return steps + "\n" + key
}

type deployBox struct {
	ID    string `json:"sandbox_id"`
	Token string `json:"lease_token"`
}

func deployCreate(t *testing.T, ctx context.Context, pf *portForward, auth []string) deployBox {
	t.Helper()
	s, body, err := deployCall(ctx, pf, "POST", "/v1/sandboxes", `{"image":"`+k8stest.ImageRef+`"}`, auth...)
	var b deployBox
	if err != nil || s != 201 || json.Unmarshal(body, &b) != nil || b.ID == "" {
		t.Fatalf("create through the Service: %d %s %v", s, body, err)
	}
	return b
}

func deployExec(t *testing.T, ctx context.Context, pf *portForward, b deployBox, command string) string {
	t.Helper()
	req, _ := json.Marshal(map[string]string{"command": command})
	s, body, err := deployCall(ctx, pf, "POST", "/v1/sandboxes/"+b.ID+"/exec", string(req), "X-Sandbox-Lease", b.Token)
	var r dkExecResult
	if err != nil || s != 200 || json.Unmarshal(body, &r) != nil || r.ReturnCode != 0 {
		t.Fatalf("exec %q: %d %s %v", command, s, body, err)
	}
	return r.Stdout
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// gatewayPods names the gateway's pods in ns.
func gatewayPods(t *testing.T, ns string) []string {
	t.Helper()
	return strings.Fields(kubectlT(t, nil, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/name=sandgate-gateway",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}"))
}

// interfaceIPv4 is the first IPv4 address of interface name.
func interfaceIPv4(name string) (string, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "", err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String(), nil
		}
	}
	return "", fmt.Errorf("%s has no IPv4 address", name)
}
