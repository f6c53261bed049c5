package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestCeilingsGateway: a real gateway refuses the create
// (memory_mib 1e8, disk_gib far over the host's disk, cpu 1000, ttl_s
// 1e9) with one 400 naming each field and its ceiling, set by flags or
// derived from the host; three creates with 40 MiB of metadata each are
// 400s naming the metadata ceiling; nothing is created.
func TestCeilingsGateway(t *testing.T) {
	t.Parallel()
	// A JSON body cap of 64 MiB: the body cap is not what refuses the
	// metadata here.
	g := startGateway(t, t.TempDir(), nil, "--max-memory-mib", "512", "--max-ttl", "1h", "--max-json-body", strconv.Itoa(64<<20))
	status, body := call(t, "POST", g.URL+"/v1/sandboxes", `{"ttl_s": 1e9, "resources": {"memory_mib": 100000000, "disk_gib": 1e7, "cpu": 1000}}`)
	if status != 400 {
		t.Fatalf("the issue's create: %d %s", status, body)
	}
	note := " (the gateway's ceiling)"
	wantProblem(t, body, map[string]string{
		"resources.memory_mib": "must be at most 512" + note,
		"ttl_s":                "must be at most 3600" + note,
		"resources.cpu":        "must be at most " + strconv.Itoa(runtime.NumCPU()) + note, // the host's, by default
		"resources.disk_gib":   "must be at most ",
	})

	const size = 40 << 20
	for range 3 {
		head, tail := `{"metadata": {"blob": "`, `"}}`
		rd := io.MultiReader(strings.NewReader(head), io.LimitReader(xs{}, size), strings.NewReader(tail))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		req, err := http.NewRequestWithContext(ctx, "POST", g.URL+"/v1/sandboxes", rd)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(head) + size + len(tail))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		cancel()
		if res.StatusCode != 400 {
			t.Fatalf("40 MiB of metadata: %d %.300s", res.StatusCode, b)
		}
		wantProblem(t, b, map[string]string{"metadata": "must be at most 65536 bytes" + note})
	}
	if status, body := call(t, "GET", g.URL+"/v1/sandboxes", ""); status != 200 || strings.Contains(string(body), "sbx-") {
		t.Fatalf("list after refused creates: %d %s", status, body)
	}
	if !strings.Contains(g.stderr.String(), "msg=ceilings memory_mib=512 ") {
		t.Errorf("the gateway did not log its ceilings:\n%s", g.stderr)
	}
}

// wantProblem checks that body is an invalid_input problem whose field
// errors are want (testkit.WantFields).
func wantProblem(t *testing.T, body []byte, want map[string]string) {
	t.Helper()
	var p struct {
		Code   string                 `json:"code"`
		Errors []providers.FieldError `json:"errors"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Code != "invalid_input" {
		t.Fatalf("problem %.300s: %v", body, err)
	}
	testkit.WantFields(t, p.Errors, want)
}

// xs is an endless stream of 'x'.
type xs struct{}

func (xs) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// TestCeilingsRefuseStart: a warm pool over a ceiling, a default TTL of no
// expiry under a TTL ceiling and a --pids-max over the process ceiling
// each stop the gateway at start-up with a message saying why.
func TestCeilingsRefuseStart(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args    []string
		mention string
	}{
		{[]string{"--max-memory-mib", "512", "--pool", "memory_mib=1024=1"}, "resources.memory_mib: must be at most 512 (the gateway's ceiling)"},
		{[]string{"--default-ttl", "0"}, "the default TTL (no expiry) is over the TTL ceiling of 86400 s"},
		{[]string{"--max-pids", "100", "--pids-max", "200"}, "--pids-max 200 is over the process ceiling of 100"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, gatewayBin, append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir()}, c.args...)...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), c.mention) {
			t.Errorf("%q: %v, want a start-up error saying %q:\n%s", c.args, err, c.mention, out)
		}
	}
}
