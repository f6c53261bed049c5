package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/testkit"
)

func readme(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestReadmeWalkthrough runs the README's walkthrough block against a real
// gateway on the local provider and checks every "# ->" line in order.
func TestReadmeWalkthrough(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	runReadmeBlock(t, "## Walkthrough", g, "SG="+g.URL+"/v1")
}

// TestReadmeCommandLine runs the README's command-line block (the client
// subcommands) the same way.
func TestReadmeCommandLine(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	runReadmeBlock(t, "## Command line", g, "GW="+gatewayBin, "SANDGATE_URL="+g.URL, "SANDGATE_LEASE=", "SANDGATE_API_KEY=")
}

// runReadmeBlock runs the first sh block under the README's heading with
// bash -euo pipefail and env, and checks that its output holds every
// "# ->" line of the block, in order.
func runReadmeBlock(t *testing.T, heading string, g *proc, env ...string) {
	t.Helper()
	for _, tool := range []string{"bash", "curl", "jq", "base64", "cmp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's blocks need %s (.ci/run installs it): %v", tool, err)
		}
	}
	doc := readme(t)
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README has no %q section", heading)
	}
	m := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(doc[i:])
	if m == nil {
		t.Fatalf("no sh block in the README's %q section", heading)
	}
	script := m[1]
	var want []string
	for _, line := range strings.Split(script, "\n") {
		if s, ok := strings.CutPrefix(line, "# -> "); ok {
			want = append(want, s)
		}
	}
	if len(want) < 5 {
		t.Fatalf("%s has only %d expectations", heading, len(want))
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s failed: %v\n%s\ngateway log:\n%s", heading, err, out, g.stderr)
	}
	lines := strings.Split(string(out), "\n")
	at := 0
	for _, w := range want {
		for at < len(lines) && strings.TrimSpace(lines[at]) != w {
			at++
		}
		if at == len(lines) {
			t.Fatalf("%s output lacks %q (in order); output:\n%s", heading, w, out)
		}
		at++
	}
}

func TestConfigTableInReadme(t *testing.T) {
	doc := readme(t)
	const begin, end = "<!-- config:begin -->\n", "<!-- config:end -->"
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatal("README lacks the config markers")
	}
	if got, want := doc[i+len(begin):j], configTable(); got != want {
		t.Fatalf("README configuration table is stale; replace it with:\n%s", want)
	}
}

func TestEnvTwins(t *testing.T) {
	env := map[string]string{
		"SANDGATE_LISTEN":        "127.0.0.1:9999",
		"SANDGATE_API_KEYS":      "a, b",
		"SANDGATE_MAX_SANDBOXES": "3",
		"SANDGATE_DEFAULT_TTL":   "0",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	c, err := parseConfig([]string{"--max-sandboxes", "5"}, lookup, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9999" || len(c.APIKeys) != 2 || c.APIKeys[1] != "b" || c.MaxSandboxes != 5 || c.DefaultTTL >= 0 {
		t.Fatalf("config %+v", c)
	}
	env["SANDGATE_MAX_SANDBOXES"] = "many"
	if _, err := parseConfig(nil, lookup, io.Discard); err == nil || !strings.Contains(err.Error(), "SANDGATE_MAX_SANDBOXES") {
		t.Fatalf("bad env twin: %v", err)
	}
	if _, err := parseConfig([]string{"--no-such-flag"}, func(string) (string, bool) { return "", false }, io.Discard); err == nil {
		t.Fatal("unknown flag accepted")
	}
}

// TestRefusesOpenListenerWithoutKey: on a non-loopback address the gateway
// will not start without an API key (no traffic is sent there).
func TestRefusesOpenListenerWithoutKey(t *testing.T) {
	cmd := exec.Command(gatewayBin, "serve", "--listen", "0.0.0.0:0", "--state-dir", t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "without an API key") {
		t.Fatalf("started without a key on 0.0.0.0: %v\n%s", err, out)
	}
}

func leaseEditor(tok string) api.ClientOption {
	return api.WithRequestEditorFn(func(ctx context.Context, req *http.Request) error {
		req.Header.Set("X-Sandbox-Lease", tok)
		return nil
	})
}

// TestLifecycle drives the whole lifecycle over real HTTP with the
// generated client against a real gateway on the local provider.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil, "--api-key", "k-test")
	ctx := context.Background()
	keyed, err := api.NewClientWithResponses(g.URL, api.WithRequestEditorFn(func(ctx context.Context, req *http.Request) error {
		req.Header.Set("Authorization", "Bearer k-test")
		return nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ttl := 300.0
	cr, err := keyed.CreateSandboxWithResponse(ctx, api.CreateSandbox{TTLS: &ttl, Files: map[string]string{"seed/a.txt": "seeded"}, Metadata: map[string]string{"run": "e2e"}})
	if err != nil || cr.JSON201 == nil {
		t.Fatalf("create: %v %s", err, cr.Body)
	}
	ref, err := cr.JSON201.AsSandboxRef()
	if err != nil {
		t.Fatal(err)
	}
	if ref.ServerURL != g.URL+"/v1" || ref.Scope != api.LeaseScopeOwner || ref.ProviderName != "local" {
		t.Fatalf("ref %+v", ref)
	}
	id := ref.SandboxID
	owner, _ := api.NewClientWithResponses(g.URL, leaseEditor(ref.LeaseToken))

	ex, err := owner.ExecCommandWithResponse(ctx, id, api.ExecRequest{Command: "cat seed/a.txt; echo err >&2; exit 7"})
	if err != nil || ex.JSON200 == nil {
		t.Fatalf("exec: %v %s", err, ex.Body)
	}
	if r := ex.JSON200; r.Stdout != "seeded" || r.Stderr != "err\n" || r.ReturnCode != 7 || r.ErrorType != nil {
		t.Fatalf("exec result %+v", r)
	}
	// The local provider measures each command inside the sandbox.
	if r := ex.JSON200; r.CPUTimeS == nil || r.PeakMemoryMib == nil || *r.PeakMemoryMib <= 0 || r.OomKilled == nil || *r.OomKilled {
		t.Fatalf("exec accounting %s", ex.Body)
	}
	timeout := 0.5
	ex, _ = owner.ExecCommandWithResponse(ctx, id, api.ExecRequest{Command: "echo started; sleep 30", TimeoutS: &timeout})
	if r := ex.JSON200; r == nil || r.ReturnCode != 125 || r.ErrorType == nil || *r.ErrorType != api.ExecErrorTypeTimeout || r.Stdout != "started\n" {
		t.Fatalf("timeout result %s", ex.Body)
	}

	data := bytes.Repeat([]byte{0, 1, 2, 255}, 1<<18)
	put, err := owner.PutFileWithBodyWithResponse(ctx, id, &api.PutFileParams{Path: "/tmp/blob"}, "application/octet-stream", bytes.NewReader(data))
	if err != nil || put.JSON200 == nil || put.JSON200.Size != int64(len(data)) {
		t.Fatalf("put: %v %s", err, put.Body)
	}
	get, err := owner.GetFileWithResponse(ctx, id, &api.GetFileParams{Path: "/tmp/blob"})
	if err != nil || !bytes.Equal(get.Body, data) || get.HTTPResponse.ContentLength != int64(len(data)) {
		t.Fatalf("get: %v len %d", err, len(get.Body))
	}
	up, err := owner.UploadFileWithResponse(ctx, id, api.UploadRequest{TargetPath: "x/y.bin", ContentsB64: base64.StdEncoding.EncodeToString([]byte("\xff\x00b"))})
	if err != nil || up.StatusCode() != 200 {
		t.Fatalf("upload: %v %s", err, up.Body)
	}
	down, err := owner.DownloadFileWithResponse(ctx, id, &api.DownloadFileParams{RemotePath: "x/y.bin"})
	if err != nil || down.JSON200 == nil || down.JSON200.ContentsB64 != base64.StdEncoding.EncodeToString([]byte("\xff\x00b")) {
		t.Fatalf("download: %v %s", err, down.Body)
	}

	op := api.LeaseScopeOperate
	ml, err := owner.CreateLeaseWithResponse(ctx, id, api.LeaseRequest{Scope: &op})
	if err != nil || ml.JSON201 == nil || ml.JSON201.LeaseToken == ref.LeaseToken {
		t.Fatalf("mint: %v %s", err, ml.Body)
	}
	operate, _ := api.NewClientWithResponses(g.URL, leaseEditor(ml.JSON201.LeaseToken))
	if st, _ := operate.GetSandboxStatusWithResponse(ctx, id); st.JSON200 == nil || st.JSON200.Status != api.SandboxStatusRunning {
		t.Fatalf("status via operate: %s", st.Body)
	}
	if d, _ := operate.DeleteSandboxWithResponse(ctx, id); d.StatusCode() != 403 {
		t.Fatalf("operate delete: %d %s", d.StatusCode(), d.Body)
	}
	ownerScope := api.LeaseScopeOwner
	if m, _ := operate.CreateLeaseWithResponse(ctx, id, api.LeaseRequest{Scope: &ownerScope}); m.StatusCode() != 403 {
		t.Fatalf("operate minting owner: %d", m.StatusCode())
	}
	if p, _ := owner.PauseSandboxWithResponse(ctx, id); p.JSON200 == nil || p.JSON200.Status != api.SandboxStatusPaused {
		t.Fatalf("pause: %s", p.Body)
	}
	if e, _ := owner.ExecCommandWithResponse(ctx, id, api.ExecRequest{Command: "true"}); e.StatusCode() != 409 {
		t.Fatalf("exec while paused: %d %s", e.StatusCode(), e.Body)
	}
	if p, _ := owner.ResumeSandboxWithResponse(ctx, id); p.JSON200 == nil || p.JSON200.Status != api.SandboxStatusRunning {
		t.Fatalf("resume: %s", p.Body)
	}
	if l, _ := keyed.ListSandboxesWithResponse(ctx, &api.ListSandboxesParams{Label: ptr("run=e2e")}); l.JSON200 == nil || len(l.JSON200.Sandboxes) != 1 {
		t.Fatalf("list: %s", l.Body)
	}
	if e, _ := owner.GetEndpointWithResponse(ctx, id, 8080); e.StatusCode() != 404 || !strings.Contains(string(e.Body), "port 8080 was not declared") {
		t.Fatalf("endpoint on local: %d %s", e.StatusCode(), e.Body)
	}
	if d, _ := owner.DeleteSandboxWithResponse(ctx, id); d.JSON200 == nil || !d.JSON200.Deleted {
		t.Fatalf("delete: %s", d.Body)
	}
	if d, _ := owner.DeleteSandboxWithResponse(ctx, id); d.StatusCode() != 404 {
		t.Fatalf("second delete: %d", d.StatusCode())
	}
	if st, _ := operate.GetSandboxStatusWithResponse(ctx, id); st.StatusCode() != 404 {
		t.Fatalf("operate token after delete: %d", st.StatusCode())
	}
}

func ptr[T any](v T) *T { return &v }

// TestNeMoGymShapes speaks exactly the JSON NeMo Gym's remote sandbox
// provider sends and reads.
func TestNeMoGymShapes(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	base := g.URL + "/v1"
	const hdr = "X-NeMo-Gym-Sandbox-Lease"
	status, body := call(t, "POST", base+"/sandboxes", `{
		"image": null, "ttl_s": 600,
		"resources": {"cpu": null, "memory_mib": null, "disk_gib": null, "gpu": null, "gpu_type": null},
		"metadata": {"env": "nemo"}, "env": {"NG_VAR": "v1"}, "entrypoint": null, "provider_options": {}}`)
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	var ref struct {
		ServerURL, SandboxID, LeaseToken, ProviderName, Scope, Workdir string
		Extra                                                          map[string]any
	}
	decodeSnake(t, body, &ref)
	if ref.Scope != "owner" || ref.SandboxID == "" || ref.LeaseToken == "" || ref.ServerURL != base || ref.Workdir == "" {
		t.Fatalf("ref %s", body)
	}
	sb := base + "/sandboxes/" + ref.SandboxID

	status, body = call(t, "POST", sb+"/exec", `{"command": "echo $NG_VAR; pwd", "cwd": null, "env": {"X": "1"}, "timeout_s": 60, "user": null}`, hdr, ref.LeaseToken)
	var ex map[string]any
	json.Unmarshal(body, &ex)
	if status != 200 || ex["stdout"] != "v1\n"+ref.Workdir+"\n" || ex["return_code"] != 0.0 || ex["error_type"] != nil || ex["stderr"] != "" {
		t.Fatalf("exec: %d %s", status, body)
	}
	payload := base64.StdEncoding.EncodeToString([]byte("print('hi')\n"))
	status, body = call(t, "POST", sb+"/upload", `{"target_path": "/workspace/code/main.py", "contents_b64": "`+payload+`"}`, hdr, ref.LeaseToken)
	if status != 200 || strings.TrimSpace(string(body)) != "{}" {
		t.Fatalf("upload: %d %s", status, body)
	}
	status, body = call(t, "GET", sb+"/download?remote_path=/workspace/code/main.py", "", hdr, ref.LeaseToken)
	var dl map[string]string
	json.Unmarshal(body, &dl)
	if status != 200 || dl["contents_b64"] != payload {
		t.Fatalf("download: %d %s", status, body)
	}
	status, body = call(t, "GET", sb+"/status", "", hdr, ref.LeaseToken)
	if status != 200 || strings.TrimSpace(string(body)) != `{"status":"running"}` {
		t.Fatalf("status: %d %s", status, body)
	}
	status, body = call(t, "POST", sb+"/leases", `{"scope":"operate","ttl_s":null}`, hdr, ref.LeaseToken)
	var op map[string]any
	json.Unmarshal(body, &op)
	if status != 201 || op["scope"] != "operate" || op["lease_token"] == ref.LeaseToken || op["sandbox_id"] != ref.SandboxID {
		t.Fatalf("mint: %d %s", status, body)
	}
	opTok := op["lease_token"].(string)
	status, body = call(t, "DELETE", sb+"/leases/release", "", hdr, opTok)
	if status != 200 || !strings.Contains(string(body), `"released":true`) || !strings.Contains(string(body), `"remaining_leases":1`) {
		t.Fatalf("release: %d %s", status, body)
	}
	if status, _ = call(t, "GET", sb+"/status", "", hdr, opTok); status != 401 {
		t.Fatalf("released token: %d", status)
	}
	status, body = call(t, "DELETE", sb, "", hdr, ref.LeaseToken)
	if status != 200 || strings.TrimSpace(string(body)) != `{"deleted":true}` {
		t.Fatalf("delete: %d %s", status, body)
	}
}

// decodeSnake decodes snake_case JSON into a struct with CamelCase fields.
func decodeSnake(t *testing.T, b []byte, v any) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	camel := map[string]any{}
	for k, val := range m {
		parts := strings.Split(k, "_")
		for i := range parts {
			if parts[i] != "" {
				parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
			}
		}
		camel[strings.Join(parts, "")] = val
	}
	out, _ := json.Marshal(camel)
	json.Unmarshal(out, v)
}

// TestRestart: the gateway stopped (SIGTERM) or killed (SIGKILL) and
// started again on the same state dir keeps its sandboxes and leases.
func TestRestart(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			g := startGateway(t, state, nil)
			base := g.URL + "/v1"
			_, body := call(t, "POST", base+"/sandboxes", `{}`)
			var ref map[string]any
			json.Unmarshal(body, &ref)
			id, owner := ref["sandbox_id"].(string), ref["lease_token"].(string)
			sb := base + "/sandboxes/" + id
			mint := func(from string) string {
				_, b := call(t, "POST", sb+"/leases", `{"scope":"operate"}`, "X-Sandbox-Lease", from)
				var m map[string]any
				json.Unmarshal(b, &m)
				return m["lease_token"].(string)
			}
			kept, released := mint(owner), mint(owner)
			child := mint(released)
			grandchild := mint(child) // released with its parent's parent
			if s, b := call(t, "DELETE", sb+"/leases/release", "", "X-Sandbox-Lease", released); s != 200 {
				t.Fatalf("release: %d %s", s, b)
			}
			// A process started by one exec that must survive the restart.
			if s, b := call(t, "POST", sb+"/exec", `{"command": "echo alive > /tmp/marker; sleep 1000 &", "preserve_background_services": true}`, "X-Sandbox-Lease", owner); s != 200 {
				t.Fatalf("exec: %d %s", s, b)
			}
			err := g.stop(sig)
			if sig == syscall.SIGTERM && err != nil {
				t.Fatalf("SIGTERM exit: %v\n%s", err, g.stderr)
			}

			g2 := startGateway(t, state, nil)
			sb = g2.URL + "/v1/sandboxes/" + id
			s, b := call(t, "POST", sb+"/exec", `{"command": "cat /tmp/marker; pgrep -x sleep >/dev/null && echo sleeping"}`, "X-Sandbox-Lease", kept)
			if s != 200 || !strings.Contains(string(b), `alive\nsleeping\n`) {
				t.Fatalf("exec after restart: %d %s\n%s", s, b, g2.stderr)
			}
			for _, tok := range []string{released, child, grandchild} {
				if s, _ := call(t, "GET", sb+"/status", "", "X-Sandbox-Lease", tok); s != 401 {
					t.Fatalf("released token (or one minted from it) after restart: %d", s)
				}
			}
			if s, _ := call(t, "DELETE", sb, "", "X-Sandbox-Lease", owner); s != 200 {
				t.Fatalf("delete after restart: %d", s)
			}
		})
	}
}

// TestStreamingFilesBoundedMemory moves 1 GiB each way through a gateway
// whose Go heap is limited to 64 MiB, and checks its peak RSS stays small.
func TestStreamingFilesBoundedMemory(t *testing.T) {
	t.Parallel()
	const size = 1 << 30
	g := startGateway(t, t.TempDir(), []string{"GOMEMLIMIT=64MiB"})
	_, body := call(t, "POST", g.URL+"/v1/sandboxes", `{}`)
	var ref map[string]any
	json.Unmarshal(body, &ref)
	url := g.URL + "/v1/sandboxes/" + ref["sandbox_id"].(string) + "/files?path=/tmp/big"
	tok := ref["lease_token"].(string)

	src := &patternReader{n: size}
	req, _ := http.NewRequest("PUT", url, src)
	req.ContentLength = -1 // chunked: the gateway cannot size a buffer from it
	req.Header.Set("X-Sandbox-Lease", tok)
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(b), `"size":`+strconv.Itoa(size)) {
		t.Fatalf("put 1 GiB: %d %s", res.StatusCode, b)
	}
	req, _ = http.NewRequest("GET", url, nil)
	req.Header.Set("X-Sandbox-Lease", tok)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	n, same, err := sameBytes(res.Body, &patternReader{n: size})
	res.Body.Close()
	if err != nil || n != size || !same {
		t.Fatalf("get 1 GiB: %d bytes, %v, the same bytes as put: %v", n, err, same)
	}
	if hwm := peakRSS(t, g.cmd.Process.Pid); hwm > 100<<20 {
		t.Fatalf("gateway peak RSS %d MiB moving 1 GiB each way", hwm>>20)
	} else {
		t.Logf("gateway peak RSS %d MiB", hwm>>20)
	}
}

// patternReader yields n bytes of a fixed non-trivial pattern: byte x is
// x ^ x>>8 ^ x>>16, which repeats every 16 MiB, so it is copied from one
// period made once (made per byte, under -race, 1 GiB took seconds of CPU).
type patternReader struct{ n, off int }

var patternPeriod = sync.OnceValue(func() []byte {
	b := make([]byte, 1<<24)
	for x := range b {
		b[x] = byte(x ^ x>>8 ^ x>>16)
	}
	return b
})

func (p *patternReader) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	if len(b) > p.n-p.off {
		b = b[:p.n-p.off]
	}
	period := patternPeriod()
	n := 0
	for n < len(b) {
		n += copy(b[n:], period[(p.off+n)%len(period):])
	}
	p.off += n
	return n, nil
}

// sameBytes reads got to its end and reports how many bytes it held and
// whether they are want's, which must hold at least as many.
func sameBytes(got, want io.Reader) (int, bool, error) {
	a, b := make([]byte, 1<<20), make([]byte, 1<<20)
	total, same := 0, true
	for {
		n, err := io.ReadFull(got, a)
		if n > 0 {
			m, _ := io.ReadFull(want, b[:n])
			same = same && m == n && bytes.Equal(a[:n], b[:n])
			total += n
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return total, same, nil
		}
		if err != nil {
			return total, same, err
		}
	}
}

// peakRSS reads VmHWM of pid in bytes.
func peakRSS(t *testing.T, pid int) int { return procStatusKiB(t, pid, "VmHWM") << 10 }

// procRSS reads VmRSS of pid in bytes.
func procRSS(t *testing.T, pid int) int { return procStatusKiB(t, pid, "VmRSS") << 10 }

// procStatusKiB reads the field (in kB) of /proc/pid/status.
func procStatusKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(field + `:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no %s in /proc/%d/status", field, pid)
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return kb
}

// TestSIGTERMDrains: an exec in flight when SIGTERM arrives completes and
// its client gets the whole result; the gateway then exits cleanly, and
// new connections are refused.
func TestSIGTERMDrains(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	id, tok := newLocalSandbox(t, g)
	sb := g.URL + "/v1/sandboxes/" + id

	type result struct {
		status int
		body   []byte
	}
	done := make(chan result, 1)
	go func() {
		s, b := call(t, "POST", sb+"/exec", `{"command": "touch /tmp/started; sleep 1; echo finished"}`, "X-Sandbox-Lease", tok)
		done <- result{s, b}
	}()
	waitStarted(t, sb, tok) // then stop the gateway
	g.cmd.Process.Signal(syscall.SIGTERM)
	r := <-done
	if r.status != 200 || !strings.Contains(string(r.body), `"stdout":"finished\n"`) {
		t.Fatalf("in-flight exec across SIGTERM: %d %s", r.status, r.body)
	}
	if err := g.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, g.stderr)
	}
	if _, err := http.Get(g.URL + "/healthz"); err == nil {
		t.Fatal("gateway still accepting after SIGTERM")
	}
}

// waitStarted returns once a command in sandbox sb has touched
// /tmp/started.
func waitStarted(t *testing.T, sb, tok string) {
	t.Helper()
	testkit.Eventually(t, "the exec to start", 10*time.Second, func() bool {
		s, b := call(t, "POST", sb+"/exec", `{"command": "test -f /tmp/started && echo yes"}`, "X-Sandbox-Lease", tok)
		return s == 200 && strings.Contains(string(b), "yes")
	})
}

// TestSecondSignalCutsDrain: a second SIGTERM while an exec still drains
// closes its connection at once instead of waiting out the 30 s grace, and
// the gateway still finishes its cleanup and exits 0: it is never killed
// by a signal halfway (a second SIGTERM once arrived during the closing of
// the provider and killed the process).
func TestSecondSignalCutsDrain(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	id, tok := newLocalSandbox(t, g)
	sb := g.URL + "/v1/sandboxes/" + id

	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest("POST", sb+"/exec", strings.NewReader(`{"command": "touch /tmp/started; sleep 60", "timeout_s": 90}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Sandbox-Lease", tok)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			// Its status went out when it started: the cut shows as a
			// body that ends early.
			b, rerr := io.ReadAll(res.Body)
			res.Body.Close()
			err = rerr
			if err == nil {
				err = fmt.Errorf("the drained exec answered %d %s", res.StatusCode, b)
			}
		}
		done <- err
	}()
	waitStarted(t, sb, tok)
	start := time.Now()
	g.cmd.Process.Signal(syscall.SIGTERM)
	testkit.EventuallyNil(t, "the shutdown after SIGTERM", 10*time.Second, func() error {
		if log := g.stderr.String(); !strings.Contains(log, "shutting down") {
			return errors.New(log)
		}
		return nil
	})
	if err := g.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("exit after a second SIGTERM: %v\n%s", err, g.stderr)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the second SIGTERM took %v to end the drain (grace 30 s)", d)
	}
	if err := <-done; err == nil || strings.Contains(err.Error(), "answered") {
		t.Errorf("the in-flight exec: %v, want its connection closed", err)
	}
	if !strings.Contains(g.stderr.String(), "second signal") {
		t.Errorf("no word of the second signal in the log:\n%s", g.stderr)
	}
}
