package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/testkit"
)

// cmdState is the part of a command's description the tests check.
type cmdState struct {
	ID         string  `json:"command_id"`
	Running    bool    `json:"running"`
	ExitCode   *int    `json:"exit_code"`
	ErrorType  *string `json:"error_type"`
	StdoutSize int64   `json:"stdout_size"`
	StderrSize int64   `json:"stderr_size"`
	Truncated  bool    `json:"truncated"`
}

// startCmd starts a durable command in sb and returns its id.
func startCmd(t *testing.T, sb dkBox, body string) string {
	t.Helper()
	s, b := call(t, "POST", sb.url+"/commands", body, "X-Sandbox-Lease", sb.token)
	var c cmdState
	if s != 201 || json.Unmarshal(b, &c) != nil || c.ID == "" {
		t.Fatalf("start %s: %d %s", body, s, b)
	}
	return c.ID
}

// waitCmd waits for command cid to end and returns its description.
func waitCmd(t *testing.T, sb dkBox, cid string) cmdState {
	t.Helper()
	var c cmdState
	testkit.Eventually(t, "command "+cid+" to end", 2*time.Minute, func() bool {
		s, b := call(t, "GET", sb.url+"/commands/"+cid+"/wait?timeout_s=30", "", "X-Sandbox-Lease", sb.token)
		if s != 200 {
			t.Fatalf("wait %s: %d %s", cid, s, b)
		}
		if bytes.Contains(b, []byte(`"command_id"`)) {
			return false // the long poll's deadline passed first
		}
		s, b = call(t, "GET", sb.url+"/commands/"+cid, "", "X-Sandbox-Lease", sb.token)
		if s != 200 || json.Unmarshal(b, &c) != nil {
			t.Fatalf("get %s: %d %s", cid, s, b)
		}
		return !c.Running
	})
	return c
}

// cmdOutput is a stream of command cid's retained output, whole.
func cmdOutput(t *testing.T, sb dkBox, cid, stream string) string {
	t.Helper()
	s, b := call(t, "GET", sb.url+"/commands/"+cid+"/output?stream="+stream+"&since=0", "", "X-Sandbox-Lease", sb.token)
	if s != 200 {
		t.Fatalf("output %s %s: %d %s", cid, stream, s, b)
	}
	return string(b)
}

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// TestCommandsSurviveGatewayKill: the gateway is SIGKILLed while ten
// commands run; a new one on the same state serves every record, byte
// and exit code exactly.
func TestCommandsSurviveGatewayKill(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	g := startGateway(t, state, nil)
	id, lease := newSandbox(t, g.URL)
	sb := dkBox{url: g.URL + "/v1/sandboxes/" + id, id: id, token: lease}
	type want struct {
		code           int
		errType        string
		stdout, stderr string
	}
	cases := []struct {
		name, body string
		want       want
	}{
		{"quiet", `{"command":"sleep 3; echo quiet-done"}`, want{0, "", "quiet-done\n", ""}},
		{"chatty", `{"command":"seq 1 1500000"}`, want{0, "", seqOutput(1500000), ""}},
		{"exit3", `{"command":"echo three; echo oops >&2; exit 3"}`, want{3, "", "three\n", "oops\n"}},
		{"timeout", `{"command":"echo before; sleep 60", "timeout_s": 2}`, want{125, "timeout", "before\n", ""}},
		{"signalled", `{"command":"echo waiting; sleep 60"}`, want{128 + int(syscall.SIGTERM), "", "waiting\n", ""}},
		{"slow", `{"command":"for i in 1 2 3 4 5; do echo $i; sleep 0.5; done"}`, want{0, "", "1\n2\n3\n4\n5\n", ""}},
		{"stdin", `{"command":"cat; echo", "stdin_b64":"aGVsbG8="}`, want{0, "", "hello\n", ""}},
		{"stderr", `{"command":"seq 1 20000 >&2"}`, want{0, "", "", seqOutput(20000)}},
		{"background", `{"command":"echo bg; sleep 30 & echo started", "preserve_background_services": true}`, want{0, "", "bg\nstarted\n", ""}},
		{"exit0", `{"command":"true"}`, want{0, "", "", ""}},
	}
	ids := map[string]string{}
	for _, c := range cases {
		ids[c.name] = startCmd(t, sb, c.body)
	}
	// The kill lands while most of them still run.
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway survived SIGKILL")
	}
	g2 := startGateway(t, state, nil)
	sb.url = g2.URL + "/v1/sandboxes/" + id
	if s, b := call(t, "POST", sb.url+"/commands/"+ids["signalled"]+"/signal", `{"signal":"SIGTERM"}`, "X-Sandbox-Lease", lease); s != 200 {
		t.Fatalf("signal after restart: %d %s", s, b)
	}
	s, b := call(t, "GET", sb.url+"/commands", "", "X-Sandbox-Lease", lease)
	var list struct {
		Commands []cmdState `json:"commands"`
	}
	if s != 200 || json.Unmarshal(b, &list) != nil || len(list.Commands) != len(cases) {
		t.Fatalf("list after restart: %d %s", s, b)
	}
	for _, c := range cases {
		cid := ids[c.name]
		got := waitCmd(t, sb, cid)
		errType := ""
		if got.ErrorType != nil {
			errType = *got.ErrorType
		}
		if got.ExitCode == nil || *got.ExitCode != c.want.code || errType != c.want.errType || got.Truncated {
			t.Errorf("%s: %+v, want exit %d error_type %q", c.name, got, c.want.code, c.want.errType)
			continue
		}
		out, errOut := cmdOutput(t, sb, cid, "stdout"), cmdOutput(t, sb, cid, "stderr")
		if out != c.want.stdout || errOut != c.want.stderr || got.StdoutSize != int64(len(out)) || got.StderrSize != int64(len(errOut)) {
			t.Errorf("%s: stdout %d bytes (%.40q), stderr %d (%.40q), sizes %d/%d; want %d and %d bytes",
				c.name, len(out), out, len(errOut), errOut, got.StdoutSize, got.StderrSize, len(c.want.stdout), len(c.want.stderr))
		}
	}
	// A command that is deleted is gone; an unknown id is 404.
	if s, _ := call(t, "DELETE", sb.url+"/commands/"+ids["exit0"], "", "X-Sandbox-Lease", lease); s != 200 {
		t.Fatalf("delete: %d", s)
	}
	if s, _ := call(t, "GET", sb.url+"/commands/"+ids["exit0"], "", "X-Sandbox-Lease", lease); s != 404 {
		t.Fatalf("deleted command: %d", s)
	}
}

// TestQuietCommandsThroughAnIdleCuttingProxy: a proxy that closes every
// connection idle for 5 s (as load balancers do, at 60 s) cuts neither a
// one-shot exec of a 20 s quiet command nor the event stream of a
// command that prints every 7 s: the gateway's heartbeats keep both
// alive, and every byte arrives once.
//
// Serial: the heartbeat's 2 s against the proxy's 5 s is the subject, and
// six gateways side by side on two cores starved a heartbeat past it.
func TestQuietCommandsThroughAnIdleCuttingProxy(t *testing.T) {
	g := startGateway(t, t.TempDir(), nil)
	id, lease := newSandbox(t, g.URL)
	px := testkit.NewIdleProxy(t, "tcp", strings.TrimPrefix(g.URL, "http://"), 5*time.Second)
	sb := dkBox{url: "http://" + px.Addr() + "/v1/sandboxes/" + id, id: id, token: lease}

	type answer struct {
		status int
		body   []byte
	}
	execDone := make(chan answer, 1)
	go func() {
		s, b := call(t, "POST", sb.url+"/exec", `{"command":"sleep 20; echo woke"}`, "X-Sandbox-Lease", lease)
		execDone <- answer{s, b}
	}()

	cid := startCmd(t, sb, `{"command":"for i in 1 2 3; do sleep 7; echo tick-$i; done"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", sb.url+"/commands/"+cid+"/output", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Sandbox-Lease", lease)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var sse bytes.Buffer
	if _, err := sse.ReadFrom(res.Body); err != nil {
		t.Fatalf("event stream cut after %d bytes: %v\n%s", sse.Len(), err, sse.String())
	}
	out, exit := parseSSE(t, sse.String())
	if out != "tick-1\ntick-2\ntick-3\n" || !strings.Contains(exit, `"exit_code":0`) {
		t.Fatalf("event stream: stdout %q, exit %s\n%s", out, exit, sse.String())
	}
	a := <-execDone
	var r struct {
		Stdout     string `json:"stdout"`
		ReturnCode int    `json:"return_code"`
	}
	if a.status != 200 || json.Unmarshal(a.body, &r) != nil || r.Stdout != "woke\n" || r.ReturnCode != 0 {
		t.Fatalf("exec through the proxy: %d %s", a.status, a.body)
	}
}

// parseSSE decodes an event stream: stdout's bytes in order and the exit
// event's data.
func parseSSE(t *testing.T, s string) (stdout, exit string) {
	t.Helper()
	var out strings.Builder
	for _, ev := range strings.Split(s, "\n\n") {
		var event, data string
		for _, line := range strings.Split(ev, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				event = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				data += v
			}
		}
		switch event {
		case "stdout":
			p, err := base64.StdEncoding.DecodeString(data)
			if err != nil {
				t.Fatalf("stdout event %q: %v", data, err)
			}
			out.Write(p)
		case "exit":
			exit = data
		}
	}
	return out.String(), exit
}

// TestExecCommandReattaches: `gateway exec` follows its command's output
// over the event stream; a connection severed mid-command is re-opened
// from the last offsets, and the output is whole, each byte once.
func TestExecCommandReattaches(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	id, lease := newSandbox(t, g.URL)
	px := testkit.NewProxy(t, "tcp", strings.TrimPrefix(g.URL, "http://"))
	cmd := exec.Command(gatewayBin, "exec", "--url", "http://"+px.Addr(), "--lease", lease, id, "--",
		"echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second; exit 5")
	cmd.Env = os.Environ()
	out, errOut := &syncBuffer{}, &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the first line", time.Minute, func() bool { return out.String() == "first\n" })
	if n := px.Sever(); n == 0 {
		t.Fatal("no connection to sever")
	}
	sb := dkBox{url: g.URL + "/v1/sandboxes/" + id, token: lease}
	dkRun(t, sb, "touch /tmp/go")
	err := cmd.Wait()
	if cmd.ProcessState.ExitCode() != 5 || out.String() != "first\nsecond\n" || !strings.Contains(errOut.String(), "reconnecting") {
		t.Fatalf("exec: %v, stdout %q, stderr %q", err, out.String(), errOut.String())
	}
}
