package main

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/kubernetes"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
)

// k8sGateway serves a gateway on the kubernetes provider (an instance of
// its own, removed at the end) in this process, on the test cluster.
func k8sGateway(b *testing.B) *httptest.Server {
	instance := "bench-" + randomSuffix()
	p, err := kubernetes.New(kubernetes.Options{RestConfig: k8stest.RestConfig(b), Namespace: k8stest.Namespace, InstanceID: instance, AgentImage: k8stest.AgentImage(b)})
	if err != nil {
		b.Fatal(err)
	}
	srv := serveInProcess(b, p)
	b.Cleanup(func() { k8stest.RemoveInstance(b, instance) })
	return srv
}

// kubectl runs the test cluster's kubectl and returns its output.
func kubectl(b *testing.B, args ...string) string {
	bin := filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(k8stest.Kubeconfig()))), "bin-v1.37.2/kubectl")
	cmd := exec.Command(bin, append([]string{"-n", k8stest.Namespace}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+k8stest.Kubeconfig())
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

type benchRef struct {
	ID  string `json:"sandbox_id"`
	Tok string `json:"lease_token"`
}

func benchCreate(b *testing.B, c *http.Client, url string) benchRef {
	var ref benchRef
	json.Unmarshal(post(b, c, url+"/v1/sandboxes", "", `{"image":"`+k8stest.ImageRef+`"}`), &ref)
	return ref
}

func benchDelete(c *http.Client, url string, ref benchRef) {
	req, _ := http.NewRequest("DELETE", url+"/v1/sandboxes/"+ref.ID, nil)
	req.Header.Set("X-Sandbox-Lease", ref.Tok)
	if res, err := c.Do(req); err == nil {
		res.Body.Close()
	}
}

// BenchmarkK8sExecTrue alternates, on the same pod, an exec of `true`
// through the whole gateway over HTTP (a stream on the sandbox's agent
// connection) with `kubectl exec <pod> -- true` (an exec through the API
// server and the kubelet each time), and reports both p50s and their
// ratio (issue 11's target: the gateway at least 10x faster).
func BenchmarkK8sExecTrue(b *testing.B) {
	srv := k8sGateway(b)
	c := srv.Client()
	ref := benchCreate(b, c, srv.URL)
	interleave(b, "kubectl",
		func() { post(b, c, srv.URL+"/v1/sandboxes/"+ref.ID+"/exec", ref.Tok, `{"command":"true"}`) },
		func() { kubectl(b, "exec", ref.ID, "-c", "sandbox", "--", "true") })
}

// BenchmarkK8sCreateExecDelete alternates create -> first exec -> delete
// through the gateway with kubectl run + wait Ready + kubectl exec +
// kubectl delete (no grace) of a pod of the same image, and reports both
// and their ratio.
func BenchmarkK8sCreateExecDelete(b *testing.B) {
	srv := k8sGateway(b)
	c := srv.Client()
	var viaGateway, viaKubectl []time.Duration
	for b.Loop() {
		t0 := time.Now()
		ref := benchCreate(b, c, srv.URL)
		post(b, c, srv.URL+"/v1/sandboxes/"+ref.ID+"/exec", ref.Tok, `{"command":"true"}`)
		benchDelete(c, srv.URL, ref)
		t1 := time.Now()
		name := "bench-kubectl-" + randomSuffix()
		kubectl(b, "run", name, "--image", k8stest.ImageRef, "--image-pull-policy", "Never", "--restart", "Never", "--labels", "sandgate.instance=bench-kubectl", "--", "sh", "-c", "while :; do sleep 3600; done")
		kubectl(b, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=60s")
		kubectl(b, "exec", name, "--", "true")
		kubectl(b, "delete", "pod", name, "--grace-period=0", "--force", "--wait=true")
		viaGateway, viaKubectl = append(viaGateway, t1.Sub(t0)), append(viaKubectl, time.Since(t1))
	}
	g, k := pct(viaGateway, 0.5), pct(viaKubectl, 0.5)
	b.ReportMetric(g, "gateway-p50-ms")
	b.ReportMetric(k, "kubectl-p50-ms")
	b.ReportMetric(g/k, "ratio")
}

// BenchmarkK8sConcurrentCreates makes 50 sandboxes at once through the
// gateway (each create returns when its agent runs a command), then
// deletes them; it reports the wall time and the creates' p50 and p99.
// b.N is ignored.
func BenchmarkK8sConcurrentCreates(b *testing.B) {
	srv := k8sGateway(b)
	c := srv.Client()
	const n = 50
	var mu sync.Mutex
	var lat []time.Duration
	var refs []benchRef
	var failed []string
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			res, err := c.Post(srv.URL+"/v1/sandboxes", "application/json", strings.NewReader(`{"image":"`+k8stest.ImageRef+`"}`))
			var ref benchRef
			if err == nil {
				err = json.NewDecoder(res.Body).Decode(&ref)
				res.Body.Close()
				if res.StatusCode != 201 {
					err = errors.New(res.Status)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err.Error())
				return
			}
			lat, refs = append(lat, time.Since(t0)), append(refs, ref)
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	defer func() {
		if len(failed) > 0 {
			b.Fatalf("%d of %d creates failed: %v", len(failed), n, failed[0])
		}
	}()
	for _, ref := range refs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			benchDelete(c, srv.URL, ref)
		}()
	}
	wg.Wait()
	b.ReportMetric(wall.Seconds(), "wall-s")
	b.ReportMetric(pct(lat, 0.5), "create-p50-ms")
	b.ReportMetric(pct(lat, 0.99), "create-p99-ms")
}
