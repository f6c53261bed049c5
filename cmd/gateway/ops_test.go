package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestMetricsAndLogs drives real traffic through a gateway (execs with
// every outcome, a terminal session with a takeover) and then checks that
// /metrics reports each metric, that no label holds an id, and that the
// JSON log has one line per request with no credential in it.
func TestMetricsAndLogs(t *testing.T) {
	t.Parallel()
	const key = "k-metrics-test-secret"
	g := startGateway(t, t.TempDir(), nil, "--api-key", key, "--log-format", "json")
	var ref struct {
		SandboxID string `json:"sandbox_id"`
		Token     string `json:"lease_token"`
	}
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{}`, "Authorization", "Bearer "+key)
	if s != 201 {
		t.Fatalf("create: %d %s", s, b)
	}
	json.Unmarshal(b, &ref)
	sb := g.URL + "/v1/sandboxes/" + ref.SandboxID
	for _, cmd := range []string{`{"command":"true"}`, `{"command":"exit 3"}`, `{"command":"sleep 5","timeout_s":0.2}`} {
		if s, b := call(t, "POST", sb+"/exec", cmd, "X-Sandbox-Lease", ref.Token); s != 200 {
			t.Fatalf("exec %s: %d %s", cmd, s, b)
		}
	}
	_, b = call(t, "POST", sb+"/leases", `{"scope":"operate"}`, "X-Sandbox-Lease", ref.Token)
	var op struct {
		Token string `json:"lease_token"`
	}
	json.Unmarshal(b, &op)

	// A terminal session: attach (lease in the query string, which must
	// not reach the log), then take it over from a second client.
	_, b = call(t, "POST", sb+"/pty", `{"command":"cat"}`, "X-Sandbox-Lease", op.Token)
	var sess struct {
		SessionID string `json:"session_id"`
	}
	json.Unmarshal(b, &sess)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ws := "ws" + strings.TrimPrefix(sb, "http") + "/pty/" + sess.SessionID + "/ws"
	first, _, err := websocket.Dial(ctx, ws+"?lease="+op.Token, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.CloseNow()
	readUntil(t, ctx, first, "connected")
	if err := first.Write(ctx, websocket.MessageBinary, append([]byte{0}, "ping-metrics\n"...)); err != nil {
		t.Fatal(err)
	}
	// Wait for cat's answer, so the bytes both ways were counted.
	for seen := ""; strings.Count(seen, "ping-metrics") < 2; {
		_, b, err := first.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for the echo: %v (have %q)", err, seen)
		}
		seen += string(b)
	}
	second, _, err := websocket.Dial(ctx, ws+"?takeover=1", &websocket.DialOptions{Subprotocols: []string{"sandgate.lease." + op.Token}})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, second, "connected")
	for {
		_, _, err := first.Read(ctx)
		if err == nil {
			continue // output that was queued before the takeover
		}
		if websocket.CloseStatus(err) != 4001 {
			t.Fatalf("evicted client: %v", err)
		}
		break
	}
	second.Close(websocket.StatusNormalClosure, "")

	res, err := http.Get(g.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(res.Body)
	res.Body.Close()
	metrics := string(text)
	// Attachments drop to 0 once the server sees the second client leave.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(metrics, "sandgate_pty_attachments 0") && time.Now().Before(deadline) {
		res, err := http.Get(g.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		text, _ = io.ReadAll(res.Body)
		res.Body.Close()
		metrics = string(text)
	}
	for _, want := range []string{
		`sandgate_sandboxes{state="running"} 1`,
		`sandgate_sandbox_creates_total{outcome="ok",provider="local"} 1`,
		`sandgate_sandbox_create_seconds_count 1`,
		`sandgate_exec_total{outcome="ok"} 1`,
		`sandgate_exec_total{outcome="nonzero"} 1`,
		`sandgate_exec_total{outcome="timeout"} 1`,
		`sandgate_exec_seconds_count 3`,
		`sandgate_pty_sessions 1`,
		`sandgate_pty_attachments 0`,
		`sandgate_pty_clients_dropped_total{reason="taken_over"} 1`,
		`sandgate_http_requests_total{code="201",route="/v1/sandboxes"} 1`,
		`sandgate_http_requests_total{code="200",route="/v1/sandboxes/{id}/exec"} 3`,
		`sandgate_http_requests_total{code="101",route="/v1/sandboxes/{id}/pty/{sid}/ws"} 2`,
		`sandgate_http_request_seconds_count{route="/v1/sandboxes/{id}/exec"} 3`,
		`sandgate_capacity_queue_waiting 0`,
		`go_goroutines `,
		`process_resident_memory_bytes `,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, want := range []string{`sandgate_pty_bytes_total{direction="out"} `, `sandgate_pty_bytes_total{direction="in"} `} {
		m := regexp.MustCompile(regexp.QuoteMeta(want) + `(\d+)`).FindStringSubmatch(metrics)
		if n, _ := strconv.Atoi(safe(m, 1)); n < len("ping-metrics\n") {
			t.Errorf("%s%s: want at least %d bytes", want, safe(m, 1), len("ping-metrics\n"))
		}
	}
	if strings.Contains(metrics, ref.SandboxID) || strings.Contains(metrics, sess.SessionID) {
		t.Error("/metrics holds a sandbox or session id")
	}

	logs := g.stderr.String()
	for name, secret := range map[string]string{"API key": key, "owner token": ref.Token, "operate token": op.Token} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds the %s", name)
		}
	}
	// A request's log line follows its handler's return; the last
	// attachment's may still be on its way.
	countRequests := func(logs string) int {
		requests := 0
		sc := bufio.NewScanner(strings.NewReader(logs))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				t.Fatalf("log line is not JSON: %q", sc.Text())
			}
			if line["msg"] == "request" {
				requests++
				if line["route"] == nil || line["request_id"] == nil || line["status"] == nil || line["duration"] == nil {
					t.Errorf("request log line lacks fields: %s", sc.Text())
				}
			}
		}
		return requests
	}
	requests := countRequests(logs)
	for deadline := time.Now().Add(10 * time.Second); requests < 9 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		requests = countRequests(g.stderr.String())
	}
	if requests < 9 {
		t.Errorf("%d request log lines, want one per request (at least 9)", requests)
	}
}

func safe(m []string, i int) string {
	if i < len(m) {
		return m[i]
	}
	return ""
}

// readUntil reads frames until a JSON text frame of the given type.
func readUntil(t *testing.T, ctx context.Context, c *websocket.Conn, typ string) {
	t.Helper()
	for {
		mt, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for %q: %v", typ, err)
		}
		if mt == websocket.MessageText && strings.Contains(string(b), `"type":"`+typ+`"`) {
			return
		}
	}
}
