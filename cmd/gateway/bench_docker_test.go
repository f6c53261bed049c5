package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/docker"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
)

// dockerGateway serves a gateway on the docker provider (an instance of
// its own, removed at the end) in this process, and returns the test
// image.
func dockerGateway(b *testing.B) (string, *httptest.Server) {
	image := dockertest.Image(b)
	instance := "bench-" + randomSuffix()
	p, err := docker.New(docker.Options{InstanceID: instance, AgentBinary: dockertest.AgentBinary(b)})
	if err != nil {
		b.Fatal(err)
	}
	srv := serveInProcess(b, p)
	b.Cleanup(func() { dockertest.RemoveInstance(b, instance) })
	return image, srv
}

// dockerOut returns a runner of the docker CLI that fails b on an error
// and returns the trimmed standard output (dockerCLI's has stderr in it).
func dockerOut(b *testing.B) func(args ...string) string {
	return func(args ...string) string {
		out, err := exec.Command("docker", args...).Output()
		if err != nil {
			b.Fatalf("docker %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
}

// BenchmarkDockerCreateFirstExec alternates, on the same daemon and image,
// a create + first exec of `true` through the whole gateway over HTTP
// with `docker run -d` + `docker exec` by the CLI, and reports both and
// their ratio (issue 4's target: the gateway faster, ratio < 1).
func BenchmarkDockerCreateFirstExec(b *testing.B) {
	image, srv := dockerGateway(b)
	c := srv.Client()
	cli := dockerOut(b)
	var viaGateway, viaCLI time.Duration
	n := 0
	for b.Loop() {
		n++
		t0 := time.Now()
		var ref struct {
			ID  string `json:"sandbox_id"`
			Tok string `json:"lease_token"`
		}
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{"image":"`+image+`"}`), &ref)
		post(b, c, srv.URL+"/v1/sandboxes/"+ref.ID+"/exec", ref.Tok, `{"command":"true"}`)
		t1 := time.Now()
		cid := cli("run", "-d", "--network", "none", image, "sh", "-c", "while :; do sleep 3600; done")
		cli("exec", cid, "true")
		t2 := time.Now()
		viaGateway += t1.Sub(t0)
		viaCLI += t2.Sub(t1)
		b.StopTimer()
		req, _ := http.NewRequest("DELETE", srv.URL+"/v1/sandboxes/"+ref.ID, nil)
		req.Header.Set("X-Sandbox-Lease", ref.Tok)
		if res, err := c.Do(req); err == nil {
			res.Body.Close()
		}
		cli("rm", "-f", cid)
		b.StartTimer()
	}
	g, k := viaGateway.Seconds()*1000/float64(n), viaCLI.Seconds()*1000/float64(n)
	b.ReportMetric(g, "gateway-ms")
	b.ReportMetric(k, "cli-ms")
	b.ReportMetric(g/k, "ratio")
}

// BenchmarkDockerExecTrue alternates, on one daemon and image, an exec of
// `true` through the whole gateway over HTTP (through the sandbox's
// agent) with `docker exec <container> true` by the CLI, as NeMo Gym's
// docker provider runs commands, and reports both p50s and their ratio
// (issue 10's target: gateway p50 at most 5 ms).
func BenchmarkDockerExecTrue(b *testing.B) {
	image, srv := dockerGateway(b)
	c := srv.Client()
	var ref struct {
		ID  string `json:"sandbox_id"`
		Tok string `json:"lease_token"`
	}
	json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{"image":"`+image+`"}`), &ref)
	out, err := exec.Command("docker", "run", "-d", "--network", "none", image, "sh", "-c", "while :; do sleep 3600; done").Output()
	if err != nil {
		b.Fatal(err)
	}
	cid := strings.TrimSpace(string(out))
	b.Cleanup(func() { exec.Command("docker", "rm", "-f", cid).Run() })
	interleave(b, "cli",
		func() { post(b, c, srv.URL+"/v1/sandboxes/"+ref.ID+"/exec", ref.Tok, `{"command":"true"}`) },
		func() {
			if err := exec.Command("docker", "exec", cid, "true").Run(); err != nil {
				b.Fatal(err)
			}
		})
}

// BenchmarkDockerSnapshotRestore alternates, on the same daemon and image,
// a snapshot of a sandbox and a create + first exec from it through the
// gateway with `docker commit` + `docker run -d` + `docker exec` by the
// CLI, and reports both and their ratio. Each round removes what it made.
func BenchmarkDockerSnapshotRestore(b *testing.B) {
	image, srv := dockerGateway(b)
	c := srv.Client()
	cli := dockerOut(b)
	var src struct {
		ID  string `json:"sandbox_id"`
		Tok string `json:"lease_token"`
	}
	json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{"image":"`+image+`"}`), &src)
	post(b, c, srv.URL+"/v1/sandboxes/"+src.ID+"/exec", src.Tok, `{"command":"head -c 10000000 /dev/urandom > /tmp/data"}`)
	cid := cli("run", "-d", "--network", "none", image, "sh", "-c", "while :; do sleep 3600; done")
	b.Cleanup(func() { exec.Command("docker", "rm", "-f", cid).Run() })
	cli("exec", cid, "sh", "-c", "head -c 10000000 /dev/urandom > /tmp/data")
	del := func(url, tok string) {
		req, _ := http.NewRequest("DELETE", url, nil)
		if tok != "" {
			req.Header.Set("X-Sandbox-Lease", tok)
		}
		if res, err := c.Do(req); err == nil {
			res.Body.Close()
		}
	}
	var viaGateway, viaCLI []time.Duration
	for b.Loop() {
		t0 := time.Now()
		var sn struct {
			ID string `json:"snapshot_id"`
		}
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes/"+src.ID+"/snapshots", src.Tok, `{}`), &sn)
		var ref struct {
			ID  string `json:"sandbox_id"`
			Tok string `json:"lease_token"`
		}
		json.Unmarshal(post(b, c, srv.URL+"/v1/sandboxes", "", `{"snapshot_id":"`+sn.ID+`"}`), &ref)
		post(b, c, srv.URL+"/v1/sandboxes/"+ref.ID+"/exec", ref.Tok, `{"command":"test -s /tmp/data"}`)
		t1 := time.Now()
		tag := "sandgate-bench-commit:" + randomSuffix()
		cli("commit", cid, tag)
		rid := cli("run", "-d", "--network", "none", tag, "sh", "-c", "while :; do sleep 3600; done")
		cli("exec", rid, "test", "-s", "/tmp/data")
		t2 := time.Now()
		viaGateway, viaCLI = append(viaGateway, t1.Sub(t0)), append(viaCLI, t2.Sub(t1))
		b.StopTimer()
		del(srv.URL+"/v1/sandboxes/"+ref.ID, ref.Tok)
		del(srv.URL+"/v1/snapshots/"+sn.ID, "")
		cli("rm", "-f", rid)
		cli("rmi", tag)
		b.StartTimer()
	}
	g, k := pct(viaGateway, 0.5), pct(viaCLI, 0.5)
	b.ReportMetric(g, "gateway-p50-ms")
	b.ReportMetric(k, "cli-p50-ms")
	b.ReportMetric(g/k, "ratio")
}

// BenchmarkDockerPoolCreateFirstExec: poolBench on the docker provider.
func BenchmarkDockerPoolCreateFirstExec(b *testing.B) {
	image := dockertest.Image(b)
	instance := "bench-" + randomSuffix()
	p, err := docker.New(docker.Options{InstanceID: instance, AgentBinary: dockertest.AgentBinary(b)})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dockertest.RemoveInstance(b, instance) })
	poolBench(b, p, image)
}
