package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/wire"
)

// The terminal routes over the fake provider, whose sessions run in an
// agent in this process: what the handlers and the manager decide
// (limits, frames, close codes) without a sandbox. Every provider runs the
// full terminal suite (testkit/terminals).

// newTerminalGateway is newGateway with a terminal manager of options o.
func newTerminalGateway(t *testing.T, o pty.Options) *gw {
	t.Helper()
	g := newGateway(t, 0)
	mgr := pty.NewManager(g.svc, o)
	h, err := New(Options{Service: g.svc, PTY: mgr, PublicURL: "http://gw.example:9"})
	if err != nil {
		t.Fatal(err)
	}
	g.srv.Close() // newGateway's, without terminals; its cleanup closes this one
	g.srv = httptest.NewServer(h)
	t.Cleanup(func() { mgr.Close() })
	return g
}

func (g *gw) session(id, tok string, body map[string]any) string {
	g.t.Helper()
	r := g.do("POST", "/v1/sandboxes/"+id+"/pty", body, lease(tok))
	if r.status != 201 {
		g.t.Fatalf("create session: %d %s", r.status, r.body)
	}
	var out struct {
		SessionID string `json:"session_id"`
	}
	r.json(g.t, &out)
	return out.SessionID
}

// TestTerminalPipeRoundTrip: a pipe-mode session's input comes back on
// channel 1, EOF ends the process, and the client gets the exit frame and
// close 1000.
func TestTerminalPipeRoundTrip(t *testing.T) {
	g := newTerminalGateway(t, pty.Options{})
	box := g.create(map[string]any{})
	sid := g.session(box.SandboxID, box.Token, map[string]any{"command": "cat", "pty": false})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(g.srv.URL, "http") + "/v1/sandboxes/" + box.SandboxID + "/pty/" + sid + "/ws"
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {box.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if err := conn.Write(ctx, websocket.MessageBinary, append([]byte{0}, "hello\n"...)); err != nil {
		t.Fatal(err)
	}
	var out []byte
	var texts []wire.ServerMsg
	for {
		typ, m, err := conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("read: %v", err)
			}
			break
		}
		if typ == websocket.MessageText {
			var msg wire.ServerMsg
			if err := json.Unmarshal(m, &msg); err != nil {
				t.Fatal(err)
			}
			texts = append(texts, msg)
			continue
		}
		f, err := wire.DecodeServer(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f.Data...)
		if string(out) == "hello\n" {
			conn.Write(ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
		}
	}
	if string(out) != "hello\n" {
		t.Fatalf("output %q", out)
	}
	if len(texts) != 2 || texts[0].Type != "connected" || texts[0].Mode != wire.ModePipe || texts[1].Type != "exit" || *texts[1].ExitCode != 0 {
		t.Fatalf("text frames %+v", texts)
	}
}

// TestPTYSessionLimits: past the per-sandbox limit a create gets 429, past
// the overall one 503 with Retry-After; deleting a session frees its slot.
func TestPTYSessionLimits(t *testing.T) {
	g := newTerminalGateway(t, pty.Options{MaxPerSandbox: 1, MaxSessions: 2})
	box := g.create(map[string]any{})
	first := g.session(box.SandboxID, box.Token, map[string]any{"command": "sleep 100"})
	r := g.do("POST", "/v1/sandboxes/"+box.SandboxID+"/pty", map[string]any{"command": "sleep 100"}, lease(box.Token))
	if r.status != 429 || r.header.Get("Retry-After") == "" {
		t.Fatalf("second session in one sandbox: %d %s", r.status, r.body)
	}
	r.problem(t)
	if d := g.do("DELETE", "/v1/sandboxes/"+box.SandboxID+"/pty/"+first, nil, lease(box.Token)); d.status != 200 {
		t.Fatalf("delete session: %d %s", d.status, d.body)
	}
	g.session(box.SandboxID, box.Token, map[string]any{"command": "sleep 100"})
	other := g.create(map[string]any{})
	g.session(other.SandboxID, other.Token, map[string]any{"command": "sleep 100"})
	third := g.create(map[string]any{})
	r = g.do("POST", "/v1/sandboxes/"+third.SandboxID+"/pty", map[string]any{"command": "sleep 100"}, lease(third.Token))
	if r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("past the overall limit: %d %s", r.status, r.body)
	}
	r.problem(t)
}
