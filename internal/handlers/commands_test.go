package handlers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

// agentExec makes g's fake provider run execs through the sandbox's real
// in-process agent, as the real providers do (durable, with Started).
func (g *gw) agentExec() {
	g.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		c, err := g.p.Agent(ctx, id)
		if err != nil {
			return providers.ExecResult{}, err
		}
		return c.Exec(ctx, req)
	}
}

// startCommand starts body as a durable command with tok and returns it.
func (g *gw) startCommand(id, tok string, body map[string]any) api.Command {
	g.t.Helper()
	r := g.do("POST", "/v1/sandboxes/"+id+"/commands", body, lease(tok))
	if r.status != 201 {
		g.t.Fatalf("start command: %d %s", r.status, r.body)
	}
	var c api.Command
	r.json(g.t, &c)
	return c
}

var commandID = regexp.MustCompile(`^cmd-[0-9a-f]{16}$`)

// TestCommandRoutes: every command route's happy path, on real commands.
func TestCommandRoutes(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	base := "/v1/sandboxes/" + a.SandboxID + "/commands"
	own := lease(a.Token)

	c := g.startCommand(a.SandboxID, a.Token, map[string]any{"command": "printf 'hello\\n'; printf oops >&2; exit 3", "env": map[string]string{"X": "1"}})
	if !commandID.MatchString(c.CommandID) || c.Command == "" || c.StartedAt.IsZero() {
		t.Fatalf("started %+v", c)
	}
	r := g.do("GET", base+"/"+c.CommandID+"/wait?timeout_s=20", nil, own)
	var res api.ExecResult
	r.json(t, &res)
	if r.status != 200 || res.Stdout != "hello\n" || res.Stderr != "oops" || res.ReturnCode != 3 || res.ErrorType != nil || res.Truncated {
		t.Fatalf("wait: %d %s", r.status, r.body)
	}
	r = g.do("GET", base+"/"+c.CommandID, nil, own)
	var got api.Command
	r.json(t, &got)
	if r.status != 200 || got.Running || got.ExitCode == nil || *got.ExitCode != 3 || got.FinishedAt == nil ||
		got.StdoutSize != 6 || got.StderrSize != 4 || got.ErrorType != nil {
		t.Fatalf("get: %d %s", r.status, r.body)
	}

	// Raw output: from since to the end, the next offset in a header.
	for _, tc := range []struct {
		query, body, next string
	}{
		{"", "hello\n", "6"},
		{"?since=2", "llo\n", "6"},
		{"?since=6", "", "6"},
		{"?stream=stderr", "oops", "4"},
		{"?stream=stderr&since=1", "ops", "4"},
	} {
		r := g.do("GET", base+"/"+c.CommandID+"/output"+tc.query, nil, own)
		if r.status != 200 || string(r.body) != tc.body || r.header.Get("X-Next-Offset") != tc.next ||
			r.header.Get("X-Command-Running") != "false" || r.header.Get("Content-Type") != "application/octet-stream" {
			t.Fatalf("output%s: %d %q next %q running %q", tc.query, r.status, r.body, r.header.Get("X-Next-Offset"), r.header.Get("X-Command-Running"))
		}
	}

	// A timeout is a result with error_type timeout.
	to := g.startCommand(a.SandboxID, a.Token, map[string]any{"command": "sleep 30", "timeout_s": 0.3})
	r = g.do("GET", base+"/"+to.CommandID+"/wait", nil, own)
	r.json(t, &res)
	if r.status != 200 || res.ReturnCode != 125 || res.ErrorType == nil || *res.ErrorType != api.ExecErrorTypeTimeout {
		t.Fatalf("timed-out wait: %d %s", r.status, r.body)
	}

	// Signal a running command; its result says how it died.
	s := g.startCommand(a.SandboxID, a.Token, map[string]any{"command": "sleep 30"})
	if r := g.do("POST", base+"/"+s.CommandID+"/signal", map[string]any{"signal": "SIGTERM"}, own); r.status != 200 || string(r.body) != "{}\n" {
		t.Fatalf("signal: %d %s", r.status, r.body)
	}
	r = g.do("GET", base+"/"+s.CommandID+"/wait?timeout_s=20", nil, own)
	r.json(t, &res)
	if r.status != 200 || res.ReturnCode != 128+15 {
		t.Fatalf("wait after SIGTERM: %d %s", r.status, r.body)
	}

	// Listed oldest first; delete forgets.
	r = g.do("GET", base, nil, own)
	var list api.CommandList
	r.json(t, &list)
	var ids []string
	for _, c := range list.Commands {
		ids = append(ids, c.CommandID)
	}
	if want := []string{c.CommandID, to.CommandID, s.CommandID}; strings.Join(ids, " ") != strings.Join(want, " ") {
		t.Fatalf("list %v, want %v", ids, want)
	}
	if r := g.do("DELETE", base+"/"+c.CommandID, nil, own); r.status != 200 {
		t.Fatalf("delete: %d %s", r.status, r.body)
	}
	if r := g.do("GET", base+"/"+c.CommandID, nil, own); r.status != 404 {
		t.Fatalf("get after delete: %d %s", r.status, r.body)
	}
}

// TestCommandWait: 202 when the wait times out before the heartbeat;
// past a heartbeat, a 200 of leading spaces then the command (running)
// or the result.
func TestCommandWait(t *testing.T) {
	t.Run("202", func(t *testing.T) {
		g := newGatewayOpts(t, Options{Heartbeat: time.Minute})
		a := g.create(map[string]any{})
		c := g.startCommand(a.SandboxID, a.Token, map[string]any{"command": "sleep 30"})
		r := g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/commands/"+c.CommandID+"/wait?timeout_s=0.2", nil, lease(a.Token))
		var got api.Command
		r.json(t, &got)
		if r.status != 202 || !got.Running || got.ExitCode != nil || got.CommandID != c.CommandID {
			t.Fatalf("wait: %d %s", r.status, r.body)
		}
	})
	for _, tc := range []struct {
		name, command string
		running       bool
	}{
		{"heartbeat, still running", "sleep 30", true},
		// It ends well after the first wait's 0.5 s: the second wait
		// beats every 50 ms for about a second (0.6 s left ~0.1 s, one
		// beat when the machine was loaded).
		{"heartbeat, then ended", "sleep 1.5; echo done", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGatewayOpts(t, Options{Heartbeat: 50 * time.Millisecond})
			a := g.create(map[string]any{})
			c := g.startCommand(a.SandboxID, a.Token, map[string]any{"command": tc.command})
			r := g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/commands/"+c.CommandID+"/wait?timeout_s=0.5", nil, lease(a.Token))
			if tc.running {
				// timeout_s 0.5 passes first.
			} else {
				r = g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/commands/"+c.CommandID+"/wait?timeout_s=20", nil, lease(a.Token))
			}
			if r.status != 200 || !bytes.HasPrefix(r.body, []byte("  ")) {
				t.Fatalf("wait: %d %q, want a 200 with leading spaces", r.status, r.body)
			}
			var body map[string]any
			r.json(t, &body)
			if tc.running {
				if body["running"] != true || body["command_id"] != c.CommandID {
					t.Fatalf("timed-out wait after heartbeats: %s", r.body)
				}
				return
			}
			if body["stdout"] != "done\n" || body["return_code"] != 0.0 || body["running"] != nil {
				t.Fatalf("ended wait after heartbeats: %s", r.body)
			}
		})
	}
}

// sseEvent is one server-sent event.
type sseEvent struct{ name, id, data string }

// readEvents reads events from r until n of them were read (0: until the
// stream ends), and counts the keepalive comments.
func readEvents(t *testing.T, r io.Reader, n int) (evs []sseEvent, keepalives int) {
	t.Helper()
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == ": keepalive":
			keepalives++
		case line == "":
			if ev.name != "" {
				evs = append(evs, ev)
				if len(evs) == n {
					return evs, keepalives
				}
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "event: "):
			ev.name = line[len("event: "):]
		case strings.HasPrefix(line, "id: "):
			ev.id = line[len("id: "):]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[len("data: "):]
		}
	}
	return evs, keepalives
}

// TestCommandSSEResume: an SSE reader cut after each event resumes with
// Last-Event-ID and gets every byte of both streams exactly once, the
// keepalives while the command is quiet, then the exit event.
func TestCommandSSEResume(t *testing.T) {
	g := newGatewayOpts(t, Options{Heartbeat: 30 * time.Millisecond})
	a := g.create(map[string]any{})
	c := g.startCommand(a.SandboxID, a.Token, map[string]any{
		"command": "for i in 1 2 3 4; do echo out$i; echo err$i >&2; sleep 0.2; done",
	})
	url := g.srv.URL + "/v1/sandboxes/" + a.SandboxID + "/commands/" + c.CommandID + "/output"
	var out [2]bytes.Buffer
	last, keepalives := "", 0
	for attempt := 0; ; attempt++ {
		if attempt > 100 {
			t.Fatal("no exit event after 100 resumes")
		}
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("X-Sandbox-Lease", a.Token)
		if last != "" {
			req.Header.Set("Last-Event-ID", last)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("sse: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
		}
		evs, k := readEvents(t, res.Body, 1) // one event, then the client goes
		res.Body.Close()
		keepalives += k
		if len(evs) != 1 {
			t.Fatalf("the stream ended without an event")
		}
		ev := evs[0]
		last = ev.id
		if ev.name == "exit" {
			var fin api.Command
			if err := json.Unmarshal([]byte(ev.data), &fin); err != nil || fin.Running || fin.ExitCode == nil || *fin.ExitCode != 0 {
				t.Fatalf("exit event %q: %v", ev.data, err)
			}
			if want := strconv.FormatInt(fin.StdoutSize, 10) + "," + strconv.FormatInt(fin.StderrSize, 10); ev.id != want {
				t.Fatalf("exit id %q, want %q", ev.id, want)
			}
			break
		}
		data, err := base64.StdEncoding.DecodeString(ev.data)
		if err != nil {
			t.Fatalf("event data %q: %v", ev.data, err)
		}
		i := map[string]int{"stdout": 0, "stderr": 1}[ev.name]
		out[i].Write(data)
		if want := strconv.Itoa(out[0].Len()) + "," + strconv.Itoa(out[1].Len()); ev.id != want {
			t.Fatalf("event id %q, want %q (the offsets after it)", ev.id, want)
		}
	}
	if got, want := out[0].String(), "out1\nout2\nout3\nout4\n"; got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
	if got, want := out[1].String(), "err1\nerr2\nerr3\nerr4\n"; got != want {
		t.Fatalf("stderr %q, want %q", got, want)
	}
	if keepalives == 0 {
		t.Fatal("no keepalive while the command was quiet")
	}

	// since=O,E from the middle gets the rest in one stream.
	req, _ := http.NewRequest("GET", url+"?since=5,10", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Sandbox-Lease", a.Token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	evs, _ := readEvents(t, res.Body, 0)
	res.Body.Close()
	var rest [2]string
	for _, ev := range evs {
		if ev.name != "exit" {
			d, _ := base64.StdEncoding.DecodeString(ev.data)
			rest[map[string]int{"stdout": 0, "stderr": 1}[ev.name]] += string(d)
		}
	}
	if rest[0] != "out2\nout3\nout4\n" || rest[1] != "err3\nerr4\n" || evs[len(evs)-1].name != "exit" {
		t.Fatalf("from 5,10: %q, %d events", rest, len(evs))
	}
}

// TestExecHeartbeat: an exec through a proxy that cuts connections idle
// for 3 heartbeat periods gets the whole result of a command quiet for 5,
// and the command's id at once; without the heartbeat the proxy cuts it.
func TestExecHeartbeat(t *testing.T) {
	const beat = 100 * time.Millisecond
	for _, tc := range []struct {
		name      string
		heartbeat time.Duration
	}{
		{"heartbeat", beat},
		{"no heartbeat", time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGatewayOpts(t, Options{Heartbeat: tc.heartbeat})
			g.agentExec()
			a := g.create(map[string]any{})
			px := testkit.NewIdleProxy(t, "tcp", strings.TrimPrefix(g.srv.URL, "http://"), 3*beat)
			req, _ := http.NewRequest("POST", "http://"+px.Addr()+"/v1/sandboxes/"+a.SandboxID+"/exec",
				strings.NewReader(`{"command": "sleep 0.5; echo done; exit 4"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Sandbox-Lease", a.Token)
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			res, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				if tc.heartbeat == beat {
					t.Fatal(err)
				}
				return // cut before the status: what the heartbeat prevents
			}
			body, err := io.ReadAll(res.Body)
			res.Body.Close()
			if tc.heartbeat != beat {
				if err == nil || px.IdleCuts() == 0 {
					t.Fatalf("the quiet exec was not cut without a heartbeat: %q, %v, %d cuts", body, err, px.IdleCuts())
				}
				return
			}
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("exec: %d %q %v (idle cuts %d)", res.StatusCode, body, err, px.IdleCuts())
			}
			if !commandID.MatchString(res.Header.Get("X-Command-Id")) || !bytes.HasPrefix(body, []byte(" ")) {
				t.Fatalf("X-Command-Id %q, body %q", res.Header.Get("X-Command-Id"), body)
			}
			var out api.ExecResult
			if err := json.Unmarshal(body, &out); err != nil || out.Stdout != "done\n" || out.ReturnCode != 4 {
				t.Fatalf("result %q: %v", body, err)
			}
		})
	}
}

// TestExecFastBody: a command that ends within a heartbeat period gets
// the body it always got, no whitespace, and its id in a header.
func TestExecFastBody(t *testing.T) {
	g := newGatewayOpts(t, Options{Heartbeat: time.Minute})
	g.agentExec()
	a := g.create(map[string]any{})
	r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/exec", map[string]any{"command": "echo hi"}, lease(a.Token))
	if r.status != 200 || !bytes.HasPrefix(r.body, []byte(`{"cpu_time_s":`)) || !commandID.MatchString(r.header.Get("X-Command-Id")) {
		t.Fatalf("exec: %d %q id %q", r.status, r.body, r.header.Get("X-Command-Id"))
	}
	var res api.ExecResult
	r.json(t, &res)
	want := res
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(want)
	// encoding/json escapes as writeExecResult does (TestExecReplyMatchesEncodingJSON).
	if buf.String() != string(r.body) {
		t.Fatalf("body %q, encoding/json %q", r.body, buf.String())
	}
}

// TestExecClientGone: a client that goes mid-exec leaves the command
// running; its result and output are fetched by the X-Command-Id it got.
// With kill_on_disconnect the command dies with the connection.
func TestExecClientGone(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run("kill_on_disconnect="+strconv.FormatBool(kill), func(t *testing.T) {
			g := newGatewayOpts(t, Options{Heartbeat: 50 * time.Millisecond})
			g.agentExec()
			a := g.create(map[string]any{})
			ctx, cancel := context.WithCancel(context.Background())
			body, _ := json.Marshal(map[string]any{"command": "echo early; sleep 0.5; echo late; exit 7", "kill_on_disconnect": kill})
			req, _ := http.NewRequestWithContext(ctx, "POST", g.srv.URL+"/v1/sandboxes/"+a.SandboxID+"/exec", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Sandbox-Lease", a.Token)
			res, err := http.DefaultClient.Do(req) // returns at the status, sent once the command runs
			if err != nil {
				t.Fatal(err)
			}
			cid := res.Header.Get("X-Command-Id")
			cancel() // the client goes
			res.Body.Close()
			if !commandID.MatchString(cid) {
				t.Fatalf("X-Command-Id %q", cid)
			}
			r := g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/commands/"+cid+"/wait?timeout_s=20", nil, lease(a.Token))
			var out api.ExecResult
			r.json(t, &out)
			if r.status != 200 {
				t.Fatalf("wait: %d %s", r.status, r.body)
			}
			if kill {
				if out.ReturnCode == 7 || strings.Contains(out.Stdout, "late") {
					t.Fatalf("killed on disconnect, yet it ran to the end: %s", r.body)
				}
				return
			}
			if out.Stdout != "early\nlate\n" || out.ReturnCode != 7 {
				t.Fatalf("result fetched by id: %s", r.body)
			}
			r = g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/commands/"+cid+"/output", nil, lease(a.Token))
			if r.status != 200 || string(r.body) != "early\nlate\n" {
				t.Fatalf("output fetched by id: %d %q", r.status, r.body)
			}
		})
	}
}

// TestCommandAccess: a command is reached only through its sandbox: a
// lease of another sandbox and an API key that did not create the sandbox
// are 403 (as on every sandbox route), a command id of another sandbox 404.
func TestCommandAccess(t *testing.T) {
	const otherKey = "test-key-2"
	g := newGateway(t, 0, func(o *sandbox.Options) { o.APIKeys = append(o.APIKeys, otherKey) })
	a := g.create(map[string]any{})
	b := g.create(map[string]any{})
	c := g.startCommand(a.SandboxID, a.Token, map[string]any{"command": "echo hi"})
	other := map[string]string{"Authorization": "Bearer " + otherKey}
	for _, p := range []string{"", "/wait", "/output"} {
		path := "/v1/sandboxes/" + a.SandboxID + "/commands/" + c.CommandID + p
		if r := g.do("GET", path, nil, lease(b.Token)); r.status != 403 {
			t.Errorf("%s with another sandbox's lease: %d %s", p, r.status, r.body)
		}
		if r := g.do("GET", path, nil, other); r.status != 403 {
			t.Errorf("%s with another API key: %d %s", p, r.status, r.body)
		}
		if r := g.do("GET", "/v1/sandboxes/"+b.SandboxID+"/commands/"+c.CommandID+p, nil, lease(b.Token)); r.status != 404 {
			t.Errorf("%s of another sandbox's command: %d %s", p, r.status, r.body)
		}
		if r := g.do("GET", path, nil, key()); r.status != 200 {
			t.Errorf("%s with the creating key: %d %s", p, r.status, r.body)
		}
	}
}

// TestCommandStartStream: a start that asks for an event stream is
// answered with one: the start event (the command, offsets 0,0), then
// the command's output and exit as GET .../output sends them; errors
// before the start are the usual problems, and the Go client's
// RunCommand reads it all in that one request.
func TestCommandStartStream(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	sse := map[string]string{"X-NeMo-Gym-Sandbox-Lease": a.Token, "Accept": "text/event-stream"}
	r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/commands", map[string]any{"command": "echo out; echo err >&2; exit 3"}, sse)
	if r.status != 200 || r.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("start: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	evs, _ := readEvents(t, bytes.NewReader(r.body), -1)
	if len(evs) < 3 || evs[0].name != "start" || evs[0].id != "0,0" || evs[len(evs)-1].name != "exit" {
		t.Fatalf("events %+v", evs)
	}
	var start, fin api.Command
	if err := json.Unmarshal([]byte(evs[0].data), &start); err != nil || !commandID.MatchString(start.CommandID) || !start.Running {
		t.Fatalf("start event %q: %v", evs[0].data, err)
	}
	if got := r.header.Get("X-Command-Id"); got != start.CommandID {
		t.Fatalf("X-Command-Id %q, start event's %q", got, start.CommandID)
	}
	var out [2]bytes.Buffer
	for _, ev := range evs[1 : len(evs)-1] {
		data, err := base64.StdEncoding.DecodeString(ev.data)
		if err != nil {
			t.Fatalf("event %+v: %v", ev, err)
		}
		out[map[string]int{"stdout": 0, "stderr": 1}[ev.name]].Write(data)
	}
	if err := json.Unmarshal([]byte(evs[len(evs)-1].data), &fin); err != nil || fin.ExitCode == nil || *fin.ExitCode != 3 ||
		fin.CommandID != start.CommandID || out[0].String() != "out\n" || out[1].String() != "err\n" {
		t.Fatalf("exit %q (%v), stdout %q, stderr %q", evs[len(evs)-1].data, err, out[0].String(), out[1].String())
	}

	// Errors before the start: problems, nothing started.
	before := len(g.commands(a.SandboxID, a.Token))
	for _, tc := range []struct {
		path string
		body any
		want int
	}{
		{"/v1/sandboxes/" + a.SandboxID + "/commands", `{"command": 3}`, 422},
		{"/v1/sandboxes/" + a.SandboxID + "/commands", `{"command": "true", "max_output_bytes": -1}`, 422},
		{"/v1/sandboxes/" + a.SandboxID + "/commands", `{"command": "true"`, 400},
		{"/v1/sandboxes/sb-nope/commands", map[string]any{"command": "true"}, 403}, // the lease is for another sandbox
	} {
		r := g.do("POST", tc.path, tc.body, sse)
		if r.status != tc.want || !strings.HasPrefix(r.header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s %v: %d %s %s, want %d problem", tc.path, tc.body, r.status, r.header.Get("Content-Type"), r.body, tc.want)
		}
	}
	if n := len(g.commands(a.SandboxID, a.Token)); n != before {
		t.Fatalf("%d commands after the refused starts, want %d", n, before)
	}

	c, err := client.New(g.srv.URL, a.Token, http.DefaultClient)
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	var started string
	end, err := c.RunCommand(context.Background(), a.SandboxID, api.CommandRequest{Command: "echo run; echo err >&2; exit 4"},
		client.FollowOptions{Stdout: &stdout, Stderr: &stderr, Started: func(c api.Command) { started = c.CommandID }})
	if err != nil || end.ExitCode == nil || *end.ExitCode != 4 || stdout.String() != "run\n" || stderr.String() != "err\n" ||
		started == "" || end.CommandID != started {
		t.Fatalf("RunCommand: %+v %v; stdout %q stderr %q started %q", end, err, stdout.String(), stderr.String(), started)
	}
}

// commands lists the sandbox's commands.
func (g *gw) commands(id, tok string) []api.Command {
	g.t.Helper()
	r := g.do("GET", "/v1/sandboxes/"+id+"/commands", nil, lease(tok))
	var list api.CommandList
	r.json(g.t, &list)
	if r.status != 200 {
		g.t.Fatalf("list commands: %d %s", r.status, r.body)
	}
	return list.Commands
}
