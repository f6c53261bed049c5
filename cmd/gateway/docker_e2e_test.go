package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The gateway on --provider docker, end to end: a real gateway process, a
// real daemon, containers of the busybox test image. Sandbox ports are
// only ever reached through their 127.0.0.1 published ports (or the
// gateway's proxy), never a container's bridge address.

// startDockerGateway runs the gateway on the docker provider (plus args)
// with its state in stateDir. When the test ends, after startGateway's
// cleanup has killed the gateway, every container labelled with the
// gateway's instance id is removed: sandboxes outlive a gateway by design,
// not the test.
func startDockerGateway(t *testing.T, stateDir string, args ...string) *proc {
	t.Helper()
	dockertest.Require(t)
	t.Cleanup(func() {
		if id := dockerInstanceID(stateDir); id != "" {
			dockertest.RemoveInstance(t, id)
		}
	})
	return startGateway(t, stateDir, nil, append([]string{"--provider", "docker"}, args...)...)
}

// dockerInstanceID is the instance id the gateway persisted in stateDir
// ("" before it first started there).
func dockerInstanceID(stateDir string) string {
	b, err := os.ReadFile(filepath.Join(stateDir, "instance.id"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// dkBox is a sandbox made through a gateway.
type dkBox struct {
	url   string // the sandbox's base URL: {gateway}/v1/sandboxes/{id}
	id    string
	token string // owner lease
}

// dkCreate creates a sandbox of the test image with the extra fields of
// body (a JSON object's members, e.g. `"ports":[8080]`).
func dkCreate(t *testing.T, g *proc, members string) dkBox {
	t.Helper()
	body := `{"image":"` + dockertest.ImageRef + `"`
	if members != "" {
		body += "," + members
	}
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", body+"}")
	if s != 201 {
		t.Fatalf("create: %d %s\n%s", s, b, g.stderr)
	}
	var ref struct {
		ID       string `json:"sandbox_id"`
		Token    string `json:"lease_token"`
		Provider string `json:"provider_name"`
	}
	if err := json.Unmarshal(b, &ref); err != nil || ref.ID == "" || ref.Token == "" {
		t.Fatalf("create: %v %s", err, b)
	}
	if ref.Provider != "docker" {
		t.Fatalf("provider_name %q", ref.Provider)
	}
	return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
}

// dkExecResult is an ExecResult as JSON.
type dkExecResult struct {
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	ReturnCode int     `json:"return_code"`
	ErrorType  *string `json:"error_type"`
}

func (r dkExecResult) String() string {
	return fmt.Sprintf("{return_code %d, error_type %q, stdout %q, stderr %q}", r.ReturnCode, r.errorType(), r.Stdout, r.Stderr)
}

func (r dkExecResult) errorType() string {
	if r.ErrorType == nil {
		return ""
	}
	return *r.ErrorType
}

// dkExec runs command with the owner lease and returns the HTTP status
// and the result (zero unless 200). It reports instead of failing, so it
// can run off the test goroutine.
func dkExec(ctx context.Context, sb dkBox, command string, preserve bool) (int, dkExecResult, error) {
	body, _ := json.Marshal(map[string]any{"command": command, "preserve_background_services": preserve})
	req, err := http.NewRequestWithContext(ctx, "POST", sb.url+"/exec", bytes.NewReader(body))
	if err != nil {
		return 0, dkExecResult{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sandbox-Lease", sb.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, dkExecResult{}, err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, dkExecResult{}, err
	}
	var out dkExecResult
	if res.StatusCode == 200 {
		if err := json.Unmarshal(data, &out); err != nil {
			return res.StatusCode, out, fmt.Errorf("exec result %s: %w", data, err)
		}
	}
	return res.StatusCode, out, nil
}

// dkRun runs command, which must answer 200 with exit status 0, and
// returns its stdout.
func dkRun(t *testing.T, sb dkBox, command string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, r, err := dkExec(ctx, sb, command, false)
	if err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("exec %q: %v %d %+v", command, err, s, r)
	}
	return r.Stdout
}

// dkContainer inspects the container named name; ok is false when the
// daemon has no such container.
func dkContainer(t *testing.T, name string) (container.InspectResponse, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := dockertest.Client(t).ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return info, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return info, true
}

// dkPattern is n deterministic bytes that are not all one value.
func dkPattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>11)
	}
	return b
}

// TestDockerLifecycle: create from the busybox image, exec, 10 MiB
// through the streaming file routes, upload/download, pause/resume and
// delete, each checked against the container itself.
func TestDockerLifecycle(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	g := startDockerGateway(t, state)
	sb := dkCreate(t, g, `"workdir":"/work","env":{"GREETING":"hi"},"files":{"seed.txt":"seeded"}`)
	info, ok := dkContainer(t, sb.id)
	if !ok || info.State == nil || !info.State.Running {
		t.Fatalf("container %s: %+v", sb.id, info.State)
	}
	if l := info.Config.Labels; l["sandgate.sandbox"] != sb.id || l["sandgate.instance"] != dockerInstanceID(state) {
		t.Fatalf("container labels %v", l)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, r, err := dkExec(ctx, sb, `echo "$GREETING from $(pwd)"; cat seed.txt; echo err >&2; exit 7`, false)
	if err != nil || s != 200 || r.Stdout != "hi from /work\nseeded" || r.Stderr != "err\n" || r.ReturnCode != 7 || r.ErrorType != nil {
		t.Fatalf("exec: %v %d %+v", err, s, r)
	}

	// 10 MiB each way through the streaming routes.
	data := dkPattern(10 << 20)
	req, _ := http.NewRequestWithContext(ctx, "PUT", sb.url+"/files?path=/tmp/blob", bytes.NewReader(data))
	req.Header.Set("X-Sandbox-Lease", sb.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	putBody, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(putBody), fmt.Sprintf(`"size":%d`, len(data))) {
		t.Fatalf("PUT: %d %s", res.StatusCode, putBody)
	}
	if got := dkRun(t, sb, "wc -c < /tmp/blob"); strings.TrimSpace(got) != fmt.Sprint(len(data)) {
		t.Fatalf("size in the container: %q", got)
	}
	req, _ = http.NewRequestWithContext(ctx, "GET", sb.url+"/files?path=/tmp/blob", nil)
	req.Header.Set("X-Sandbox-Lease", sb.token)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.Copy(h, res.Body)
	res.Body.Close()
	want := sha256.Sum256(data)
	if err != nil || res.StatusCode != 200 || n != int64(len(data)) || res.ContentLength != int64(len(data)) {
		t.Fatalf("GET: %d, %d bytes (Content-Length %d), %v", res.StatusCode, n, res.ContentLength, err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("GET: the content differs from what was PUT")
	}

	// The JSON/base64 routes; parents are made.
	payload := []byte("\xff\x00binary\n")
	up := `{"target_path":"x/y.bin","contents_b64":"` + base64.StdEncoding.EncodeToString(payload) + `"}`
	if s, b := call(t, "POST", sb.url+"/upload", up, "X-Sandbox-Lease", sb.token); s != 200 {
		t.Fatalf("upload: %d %s", s, b)
	}
	if got := dkRun(t, sb, "wc -c < /work/x/y.bin; tail -c 7 /work/x/y.bin"); got != "9\nbinary\n" {
		t.Fatalf("uploaded file in the container: %q", got)
	}
	s, b := call(t, "GET", sb.url+"/download?remote_path=x/y.bin", "", "X-Sandbox-Lease", sb.token)
	var down struct {
		B64 string `json:"contents_b64"`
	}
	if json.Unmarshal(b, &down); s != 200 || down.B64 != base64.StdEncoding.EncodeToString(payload) {
		t.Fatalf("download: %d %s", s, b)
	}

	// Pause freezes the container; exec is refused until resume.
	if s, b := call(t, "POST", sb.url+"/pause", "", "X-Sandbox-Lease", sb.token); s != 200 || !strings.Contains(string(b), `"status":"paused"`) {
		t.Fatalf("pause: %d %s", s, b)
	}
	if info, _ := dkContainer(t, sb.id); !info.State.Paused {
		t.Fatal("container not paused")
	}
	if s, b := call(t, "POST", sb.url+"/exec", `{"command":"true"}`, "X-Sandbox-Lease", sb.token); s != 409 {
		t.Fatalf("exec while paused: %d %s", s, b)
	}
	if s, b := call(t, "POST", sb.url+"/resume", "", "X-Sandbox-Lease", sb.token); s != 200 || !strings.Contains(string(b), `"status":"running"`) {
		t.Fatalf("resume: %d %s", s, b)
	}
	if got := dkRun(t, sb, "echo resumed"); got != "resumed\n" {
		t.Fatalf("exec after resume: %q", got)
	}

	if s, b := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
		t.Fatalf("delete: %d %s", s, b)
	}
	if _, ok := dkContainer(t, sb.id); ok {
		t.Fatal("container still there after delete")
	}
	if s, _ := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 404 {
		t.Fatalf("second delete: %d", s)
	}
}

// TestDockerProxyAndEndpoint: busybox httpd in the sandbox on a declared
// port is reachable at the 127.0.0.1 endpoint and through the gateway's
// lease-checked proxy; without a valid lease the proxy refuses.
func TestDockerProxyAndEndpoint(t *testing.T) {
	t.Parallel()
	g := startDockerGateway(t, t.TempDir())
	sb := dkCreate(t, g, `"ports":[8080]`)
	other := dkCreate(t, g, "")
	dkRun(t, sb, "mkdir -p /www && echo hello-from-httpd > /www/index.html")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// httpd forks into the background: keep it.
	if s, r, err := dkExec(ctx, sb, "httpd -p 8080 -h /www", true); err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("start httpd: %v %d %+v", err, s, r)
	}

	proxyReaches(t, sb, "hello-from-httpd\n")
	if s, b := call(t, "GET", sb.url+"/endpoints/9090", "", "X-Sandbox-Lease", sb.token); s != 404 {
		t.Fatalf("undeclared port's endpoint: %d %s", s, b)
	}
	proxied := sb.url + "/proxy/8080/index.html"
	// A browser's way: the lease in the query.
	if s, b := call(t, "GET", proxied+"?lease="+sb.token, ""); s != 200 || string(b) != "hello-from-httpd\n" {
		t.Fatalf("proxy with ?lease=: %d %q", s, b)
	}

	for _, c := range []struct {
		name   string
		hdr    []string
		status int
	}{
		{"no lease", nil, 401},
		{"bad lease", []string{"X-Sandbox-Lease", "not-a-token"}, 401},
		{"another sandbox's lease", []string{"X-Sandbox-Lease", other.token}, 403},
	} {
		s, b := call(t, "GET", proxied, "", c.hdr...)
		if s != c.status || strings.Contains(string(b), "hello-from-httpd") {
			t.Errorf("proxy with %s: %d %q, want %d", c.name, s, b, c.status)
		}
	}
	if s, b := call(t, "GET", sb.url+"/proxy/9090/", "", "X-Sandbox-Lease", sb.token); s != 404 {
		t.Errorf("proxy to an undeclared port: %d %s", s, b)
	}
}

// TestDockerKillMidExec: the sandbox's container killed behind the
// gateway's back during an exec: the exec answers promptly (125/sandbox,
// or 409 once the gateway knows it stopped), never hangs, and so do later
// ones.
func TestDockerKillMidExec(t *testing.T) {
	g := startDockerGateway(t, t.TempDir())
	sb := dkCreate(t, g, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	done := dkExecInFlight(t, ctx, sb, "echo started; sleep 300")
	if err := dockertest.Client(t).ContainerKill(ctx, sb.id, "KILL"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatal(a.err)
		}
		if !(a.status == 409 || a.status == 200 && a.res.ReturnCode == 125 && a.res.errorType() == "sandbox") {
			t.Fatalf("exec in flight when its container was killed: %d %+v", a.status, a.res)
		}
		t.Logf("in-flight exec answered %d %+v after %v", a.status, a.res, time.Since(killed))
	case <-time.After(30 * time.Second):
		t.Fatalf("exec hangs after its container was killed\n%s", g.stderr)
	}
	if el := time.Since(killed); el > 10*time.Second {
		t.Errorf("the exec took %v to answer", el)
	}

	start := time.Now()
	s, r, err := dkExec(ctx, sb, "true", false)
	if err != nil || !(s == 409 || s == 200 && r.ReturnCode == 125 && r.errorType() == "sandbox") {
		t.Fatalf("exec after the kill: %v %d %+v", err, s, r)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("exec after the kill took %v", el)
	}
	if s, b := call(t, "GET", sb.url+"/status", "", "X-Sandbox-Lease", sb.token); s != 200 || strings.Contains(string(b), `"running"`) {
		t.Errorf("status after the kill: %d %s", s, b)
	}
	if s, b := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
		t.Errorf("delete after the kill: %d %s", s, b)
	}
}

// TestDockerDaemonUnreachable: the gateway talks to the daemon through a
// proxy socket the test cuts (the shared daemon itself keeps running).
// While cut, /readyz and creates fail fast (503); exec does not need the
// daemon on the direct path to the sandbox's agent: an exec in flight
// runs on and new ones work (the exec path's failing fast is
// TestDaemonDown/exec in the provider). Restored, the same gateway
// serves again without a restart.
func TestDockerDaemonUnreachable(t *testing.T) {
	dockertest.Require(t)
	px := dockertest.NewProxy(t)
	g := startDockerGateway(t, t.TempDir(), "--docker-host", px.Host())
	sb := dkCreate(t, g, "")
	if s, b := call(t, "GET", g.URL+"/readyz", ""); s != 200 {
		t.Fatalf("readyz: %d %s", s, b)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	flight, stop := context.WithCancel(ctx)
	defer stop()
	done := dkExecInFlight(t, flight, sb, "sleep 300")

	px.Cut()
	quick := func(what string, f func()) {
		t.Helper()
		start := time.Now()
		f()
		if el := time.Since(start); el > 5*time.Second {
			t.Errorf("%s took %v with the daemon unreachable", what, el)
		}
	}
	quick("readyz", func() {
		if s, b := call(t, "GET", g.URL+"/readyz", ""); s != 503 {
			t.Errorf("readyz with the daemon unreachable: %d %s", s, b)
		}
	})
	quick("exec", func() {
		if got := dkRun(t, sb, "echo hi"); got != "hi\n" {
			t.Errorf("exec with the daemon unreachable: %q", got)
		}
	})
	select {
	case a := <-done:
		t.Fatalf("the exec in flight ended when the daemon went away: %v %d %+v", a.err, a.status, a.res)
	default:
	}
	quick("create", func() {
		s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image":"`+dockertest.ImageRef+`"}`)
		if s != 503 {
			t.Errorf("create with the daemon unreachable: %d %s", s, b)
		}
	})

	px.Restore(t)
	testkit.Eventually(t, "readyz after the daemon came back", 30*time.Second, func() bool {
		s, _ := call(t, "GET", g.URL+"/readyz", "")
		return s == 200
	})
	if got := dkRun(t, sb, "echo back"); got != "back\n" {
		t.Fatalf("exec after the daemon came back: %q", got)
	}
	stop()
	if a := <-done; a.err == nil {
		t.Errorf("the exec in flight, its client gone: %d %+v", a.status, a.res)
	}
	if s, b := call(t, "GET", sb.url+"/status", "", "X-Sandbox-Lease", sb.token); s != 200 || !strings.Contains(string(b), `"running"`) {
		t.Fatalf("status after the daemon came back: %d %s", s, b)
	}
	sb2 := dkCreate(t, g, "")
	if got := dkRun(t, sb2, "echo new"); got != "new\n" {
		t.Fatalf("exec in a sandbox made after the outage: %q", got)
	}
}

// dkSandboxID is a fresh id in the gateway's format.
func dkSandboxID() string {
	b := make([]byte, 13)
	rand.Read(b)
	return "sbx-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))[:20]
}

// dkLabelled starts a keep-alive container labelled as sandbox id of
// gateway instance, as a gateway would have made it, and removes it when
// the test ends.
func dkLabelled(t *testing.T, id, instance string) {
	t.Helper()
	cli := dockertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cli.ContainerCreate(ctx, &container.Config{
		Image:      dockertest.ImageRef,
		Entrypoint: []string{"/bin/sh", "-c", "while :; do sleep 3600; done"},
		Labels:     map[string]string{"sandgate.sandbox": id, "sandgate.instance": instance},
	}, &container.HostConfig{NetworkMode: "none"}, nil, nil, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := cli.ContainerRemove(context.Background(), c.ID, container.RemoveOptions{Force: true})
		if err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove %s: %v", id, err)
		}
	})
	if err := cli.ContainerStart(ctx, c.ID, container.StartOptions{}); err != nil {
		t.Fatal(err)
	}
}

// dkLabelledNetwork makes a network labelled as sandbox id's own of
// gateway instance (as a create cut short before its container would have
// left it) and returns its docker id; it is removed when the test ends.
func dkLabelledNetwork(t *testing.T, id, instance string) string {
	t.Helper()
	cli := dockertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := cli.NetworkCreate(ctx, "sandgate-"+id, network.CreateOptions{
		Driver: "bridge",
		Labels: map[string]string{"sandgate.sandbox": id, "sandgate.instance": instance},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cli.NetworkRemove(context.Background(), n.ID); err != nil && !cerrdefs.IsNotFound(err) {
			t.Errorf("remove network %s: %v", id, err)
		}
	})
	return n.ID
}

// dkNetworkExists reports whether the daemon has network netID.
func dkNetworkExists(t *testing.T, netID string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := dockertest.Client(t).NetworkInspect(ctx, netID, network.InspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// TestDockerGatewayKilledAndRestarted: SIGKILL the gateway, restart it on
// the same state dir: its sandbox is adopted with its processes, files and
// tokens; a labelled container of this instance with no record (an
// orphan) is removed at start-up, and so is a labelled network with
// neither container nor record; those of another instance are left alone.
func TestDockerGatewayKilledAndRestarted(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	g := startDockerGateway(t, state)
	instance := dockerInstanceID(state)
	if instance == "" {
		t.Fatal("no instance id in the state dir")
	}
	sb := dkCreate(t, g, "")
	mint := func() string {
		s, b := call(t, "POST", sb.url+"/leases", `{"scope":"operate"}`, "X-Sandbox-Lease", sb.token)
		var m struct {
			Token string `json:"lease_token"`
		}
		if json.Unmarshal(b, &m); s != 201 || m.Token == "" {
			t.Fatalf("mint: %d %s", s, b)
		}
		return m.Token
	}
	kept, released := mint(), mint()
	if s, b := call(t, "DELETE", sb.url+"/leases/release", "", "X-Sandbox-Lease", released); s != 200 {
		t.Fatalf("release: %d %s", s, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s, r, err := dkExec(ctx, sb, "echo alive > /tmp/marker; sleep 1000 &", true); err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("exec: %v %d %+v", err, s, r)
	}

	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	// Made while the gateway is down: one of ours it has no record of,
	// one of another gateway instance on the same daemon.
	orphan, foreign := dkSandboxID(), dkSandboxID()
	dkLabelled(t, orphan, instance)
	dkLabelled(t, foreign, "e2e-other-"+strings.ToLower(rand.Text()[:8]))
	orphanNet := dkLabelledNetwork(t, dkSandboxID(), instance)
	foreignNet := dkLabelledNetwork(t, dkSandboxID(), "e2e-other-"+strings.ToLower(rand.Text()[:8]))

	g2 := startDockerGateway(t, state)
	if dockerInstanceID(state) != instance {
		t.Fatal("the instance id changed across the restart")
	}
	sb.url = g2.URL + "/v1/sandboxes/" + sb.id
	operate := dkBox{url: sb.url, id: sb.id, token: kept}
	if got := dkRun(t, operate, "cat /tmp/marker; ps -o args | grep -c '^sleep 1000'"); got != "alive\n1\n" {
		t.Fatalf("adopted sandbox after the restart: %q\n%s", got, g2.stderr)
	}
	if s, b := call(t, "GET", sb.url+"/status", "", "X-Sandbox-Lease", sb.token); s != 200 || !strings.Contains(string(b), `"running"`) {
		t.Fatalf("owner token after the restart: %d %s", s, b)
	}
	if s, _ := call(t, "GET", sb.url+"/status", "", "X-Sandbox-Lease", released); s != 401 {
		t.Fatalf("released token after the restart: %d", s)
	}

	// Reconciliation runs before the gateway listens.
	if _, ok := dkContainer(t, orphan); ok {
		t.Fatalf("orphan %s of this instance survived the restart\n%s", orphan, g2.stderr)
	}
	if info, ok := dkContainer(t, foreign); !ok || info.State == nil || !info.State.Running {
		t.Fatalf("another instance's container %s was touched", foreign)
	}
	if !strings.Contains(g2.stderr.String(), orphan) {
		t.Errorf("the gateway did not log removing the orphan")
	}
	if dkNetworkExists(t, orphanNet) {
		t.Errorf("orphan network of this instance survived the restart\n%s", g2.stderr)
	}
	if !dkNetworkExists(t, foreignNet) {
		t.Errorf("another instance's network was removed")
	}
	if s, b := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
		t.Fatalf("delete after the restart: %d %s", s, b)
	}
	if _, ok := dkContainer(t, sb.id); ok {
		t.Fatal("container still there after delete")
	}
}

// dkAnswer is how an exec in flight ended.
type dkAnswer struct {
	status int
	res    dkExecResult
	err    error
}

// dkExecInFlight starts cmd (which runs `sleep 300`) as an exec on its own
// goroutine and returns once the sleep runs; the channel gets the answer.
func dkExecInFlight(t *testing.T, ctx context.Context, sb dkBox, cmd string) <-chan dkAnswer {
	t.Helper()
	done := make(chan dkAnswer, 1)
	go func() {
		s, r, err := dkExec(ctx, sb, cmd, false)
		done <- dkAnswer{s, r, err}
	}()
	testkit.Eventually(t, "the sleep to run", 20*time.Second, func() bool {
		return strings.Contains(dkRun(t, sb, "ps -o args"), "sleep 300")
	})
	return done
}

// TestDockerTenantNetworks: two API keys, each with a sandbox that
// declares a port. A reaches neither B's service at B's container address
// nor a host listener on 0.0.0.0 through its network's gateway address
// (each attack worked when sandboxes with ports shared the default
// bridge); B's service still answers through the gateway's proxy and at
// its 127.0.0.1 endpoint.
func TestDockerTenantNetworks(t *testing.T) {
	t.Parallel()
	g := startDockerGateway(t, t.TempDir(), "--api-key", "key-a,key-b")
	create := func(key string) dkBox {
		s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image":"`+dockertest.ImageRef+`","ports":[8080]}`, "Authorization", "Bearer "+key)
		var ref struct {
			ID    string `json:"sandbox_id"`
			Token string `json:"lease_token"`
		}
		if err := json.Unmarshal(b, &ref); s != 201 || err != nil {
			t.Fatalf("create with %s: %d %s\n%s", key, s, b, g.stderr)
		}
		return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
	}
	a, b := create("key-a"), create("key-b")
	dkRun(t, b, "mkdir -p /www && echo tenant-B > /www/index.html")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s, r, err := dkExec(ctx, b, "httpd -p 8080 -h /www", true); err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("start httpd: %v %d %+v", err, s, r)
	}
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	defer func() { ln.Close(); <-done }()

	infoA, _ := dkContainer(t, a.id)
	infoB, _ := dkContainer(t, b.id)
	var gw, bIP string
	for _, n := range infoA.NetworkSettings.Networks {
		gw = n.Gateway
	}
	for _, n := range infoB.NetworkSettings.Networks {
		bIP = n.IPAddress
	}
	if gw == "" || bIP == "" || len(infoA.NetworkSettings.Networks) != 1 {
		t.Fatalf("A's networks %+v, B's address %q", infoA.NetworkSettings.Networks, bIP)
	}
	// busybox nc speaks the HTTP (the static busybox's wget crashes).
	get := `printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 3 ` + bIP + ` 8080; true`
	if out := dkRun(t, a, get); strings.Contains(out, "tenant-B") {
		t.Errorf("tenant A read tenant B's service at %s: %q", bIP, out)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	dkRun(t, a, fmt.Sprintf("nc -w 3 %s %d </dev/null; true", gw, port))
	if n := accepted.Load(); n != 0 {
		t.Errorf("tenant A reached a host listener at %s:%d (%d connections)", gw, port, n)
	}
	// B itself serves; the proxy and the endpoint still reach it.
	if out := dkRun(t, b, strings.Replace(get, bIP, "127.0.0.1", 1)); !strings.Contains(out, "tenant-B") {
		t.Fatalf("B's own service: %q", out)
	}
	testkit.Eventually(t, "B's service through the proxy", 20*time.Second, func() bool {
		s, body := call(t, "GET", b.url+"/proxy/8080/index.html", "", "X-Sandbox-Lease", b.token)
		return s == 200 && string(body) == "tenant-B\n"
	})
	s, body := call(t, "GET", b.url+"/endpoints/8080", "", "X-Sandbox-Lease", b.token)
	var ep struct {
		Endpoint string `json:"endpoint"`
	}
	if json.Unmarshal(body, &ep); s != 200 {
		t.Fatalf("endpoint: %d %s", s, body)
	}
	if s, body := call(t, "GET", ep.Endpoint+"/index.html", ""); s != 200 || string(body) != "tenant-B\n" {
		t.Fatalf("at the endpoint: %d %q", s, body)
	}
	if s, body := call(t, "DELETE", a.url, "", "X-Sandbox-Lease", a.token); s != 200 {
		t.Fatalf("delete A: %d %s", s, body)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	nets, err := dockertest.Client(t).NetworkList(ctx2, network.ListOptions{Filters: filters.NewArgs(filters.Arg("label", "sandgate.sandbox="+a.id))})
	if err != nil || len(nets) != 0 {
		t.Fatalf("A's network after its delete: %v %+v", err, nets)
	}
}
