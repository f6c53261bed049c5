package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/testkit"
	"github.com/sandgate/sandgate/internal/wire"
)

// wsTerm is a test's WebSocket attach to a terminal session.
type wsTerm struct {
	t      *testing.T
	c      *websocket.Conn
	out    []byte // replay and live output, in order
	from   int64  // the offset of out[0]
	exit   *int
	closed bool
}

func attachTerm(t *testing.T, sb dkBox, sid, query string) *wsTerm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(sb.url, "http") + "/pty/" + sid + "/ws"
	if query != "" {
		u += "?" + query
	}
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {sb.token}}})
	if err != nil {
		t.Fatalf("attach %s: %v", sid, err)
	}
	c.SetReadLimit(-1)
	t.Cleanup(func() { c.CloseNow() })
	return &wsTerm{t: t, c: c, from: -1}
}

// until reads frames until cond holds, the process exits or d passes.
func (m *wsTerm) until(d time.Duration, what string, cond func(*wsTerm) bool) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for !cond(m) {
		if m.exit != nil || m.closed {
			m.t.Fatalf("%s: the session ended first (exit %v); output %q", what, m.exit, m.out)
		}
		typ, b, err := m.c.Read(ctx)
		if err != nil {
			m.closed = true
			if cond(m) {
				return
			}
			m.t.Fatalf("%s: %v; output %q", what, err, m.out)
		}
		if typ == websocket.MessageText {
			var msg wire.ServerMsg
			json.Unmarshal(b, &msg)
			if msg.Type == "exit" {
				m.exit = msg.ExitCode
			}
			continue
		}
		f, err := wire.DecodeServer(b)
		if err != nil {
			m.t.Fatal(err)
		}
		if f.Channel == wire.ChanReplay && m.from < 0 {
			m.from = f.Offset
		}
		if m.from < 0 {
			m.from = 0
		}
		m.out = append(m.out, f.Data...)
	}
}

func (m *wsTerm) send(s string) {
	m.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.c.Write(ctx, websocket.MessageBinary, append([]byte{wire.ChanStdin}, s...)); err != nil {
		m.t.Fatal(err)
	}
}

func (m *wsTerm) exited(code int) func(*wsTerm) bool {
	return func(m *wsTerm) bool { return m.exit != nil && *m.exit == code }
}

func has(s string) func(*wsTerm) bool {
	return func(m *wsTerm) bool { return strings.Contains(string(m.out), s) }
}

type sessionView struct {
	SessionID    string `json:"session_id"`
	Running      bool   `json:"running"`
	OutputOffset int64  `json:"output_offset"`
	ExitCode     *int   `json:"exit_code"`
	Mode         string `json:"mode"`
}

func ptyCreate(t *testing.T, sb dkBox, body string) string {
	t.Helper()
	s, b := call(t, "POST", sb.url+"/pty", body, "X-Sandbox-Lease", sb.token)
	var r struct {
		SessionID string `json:"session_id"`
	}
	if json.Unmarshal(b, &r); s != 201 || r.SessionID == "" {
		t.Fatalf("create session: %d %s", s, b)
	}
	return r.SessionID
}

func ptyList(t *testing.T, sb dkBox) map[string]sessionView {
	t.Helper()
	s, b := call(t, "GET", sb.url+"/pty", "", "X-Sandbox-Lease", sb.token)
	var r struct{ Sessions []sessionView }
	if json.Unmarshal(b, &r); s != 200 {
		t.Fatalf("list sessions: %d %s", s, b)
	}
	out := map[string]sessionView{}
	for _, v := range r.Sessions {
		out[v.SessionID] = v
	}
	return out
}

// TestTerminalsSurviveGatewayKill: the sandbox holds its terminal
// sessions (Docker: its agent; local: its init), so a gateway SIGKILLed
// and restarted finds all three (one attached, one detached mid-output,
// one exited): a re-attach with since gets exactly the bytes it missed,
// the exit code is kept, and the attached shell takes input again.
func TestTerminalsSurviveGatewayKill(t *testing.T) {
	t.Parallel()
	t.Run("local", func(t *testing.T) {
		t.Parallel()
		terminalsSurviveGatewayKill(t, func(state string) *proc { return startGateway(t, state, nil) }, func(g *proc) dkBox {
			s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{}`)
			var ref struct {
				ID    string `json:"sandbox_id"`
				Token string `json:"lease_token"`
			}
			if json.Unmarshal(b, &ref); s != 201 {
				t.Fatalf("create: %d %s", s, b)
			}
			return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
		})
	})
	t.Run("docker", func(t *testing.T) {
		t.Parallel()
		terminalsSurviveGatewayKill(t, func(state string) *proc { return startDockerGateway(t, state) }, func(g *proc) dkBox { return dkCreate(t, g, "") })
	})
}

func terminalsSurviveGatewayKill(t *testing.T, start func(state string) *proc, create func(*proc) dkBox) {
	state := t.TempDir()
	g := start(state)
	sb := create(g)

	shell := ptyCreate(t, sb, `{"pty":true}`)
	a := attachTerm(t, sb, shell, "")
	a.send("echo one-$((40+2))\n")
	a.until(20*time.Second, "the shell's echo", has("one-42"))

	const lines = 80
	var want strings.Builder
	for i := range lines {
		fmt.Fprintf(&want, "line-%d\n", i)
	}
	ticker := ptyCreate(t, sb, fmt.Sprintf(`{"pty":false,"command":"i=0; while [ $i -lt %d ]; do echo line-$i; i=$((i+1)); sleep 0.05; done; exit 5"}`, lines))
	b := attachTerm(t, sb, ticker, "")
	b.until(20*time.Second, "the first lines", has("line-3\n"))
	b.c.CloseNow() // detached mid-output
	seen := int64(len(b.out))

	done := ptyCreate(t, sb, `{"pty":false,"command":"echo bye; exit 7"}`)
	testkit.Eventually(t, "the short session to exit", 20*time.Second, func() bool {
		v := ptyList(t, sb)[done]
		return v.ExitCode != nil
	})

	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	g2 := start(state)
	sb.url = g2.URL + "/v1/sandboxes/" + sb.id

	list := ptyList(t, sb)
	if len(list) != 3 {
		t.Fatalf("after the restart: %d sessions listed, want 3: %+v", len(list), list)
	}
	if v := list[done]; v.Running || v.ExitCode == nil || *v.ExitCode != 7 {
		t.Fatalf("the exited session after the restart: %+v", v)
	}
	if v := list[shell]; !v.Running || v.Mode != "pty" {
		t.Fatalf("the shell after the restart: %+v", v)
	}

	// The detached one: exactly what was missed, then the rest and the exit.
	b2 := attachTerm(t, sb, ticker, fmt.Sprintf("since=%d", seen))
	b2.until(60*time.Second, "the ticker's end", b2.exited(5))
	if b2.from != seen {
		t.Fatalf("replay from %d, want %d", b2.from, seen)
	}
	if got := string(b.out[:seen]) + string(b2.out); got != want.String() {
		t.Fatalf("output across the restart:\n got %q\nwant %q", got, want.String())
	}

	// The exited one: its output and its code.
	c := attachTerm(t, sb, done, "since=0")
	c.until(20*time.Second, "the exited session's replay", c.exited(7))
	if string(c.out) != "bye\n" {
		t.Fatalf("exited session replay %q", c.out)
	}

	// The shell: its history replayed, and it takes input.
	a2 := attachTerm(t, sb, shell, "since=0")
	a2.until(20*time.Second, "the shell's replay", has("one-42"))
	a2.send("exit 3\n")
	a2.until(20*time.Second, "the shell's exit", a2.exited(3))
	if s, b := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
		t.Fatalf("delete: %d %s", s, b)
	}
}

// TestDockerAgentKilled: hostile code that kills the sandbox's agent gets
// a sandbox in error (with the reason) whose calls answer 409 at once,
// not a hang; the sandbox can still be deleted.
func TestDockerAgentKilled(t *testing.T) {
	t.Parallel()
	g := startDockerGateway(t, t.TempDir())
	sb := dkCreate(t, g, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Every sandgate-agent process: the daemon first (a bridge killed
	// before it would let the gateway reconnect to the daemon in between),
	// then the bridges.
	s, r, err := dkExec(ctx, sb, `for p in /proc/[0-9]*; do grep -q serve $p/cmdline 2>/dev/null && [ "$(cat $p/comm)" = sandgate-agent ] && kill -9 ${p#/proc/}; done; for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sandgate-agent ] && kill -9 ${p#/proc/}; done; sleep 5`, false)
	if err != nil {
		t.Fatal(err)
	}
	// Its answer is committed (200, X-Command-Id) once the agent says the
	// command started: the agent's death is then told in it as a runtime
	// failure, never as an exit. A command that kills the agent before
	// that word is sent (the direct path makes it a race on two loaded
	// cores) answers 409: the sandbox is in error (checked below).
	if s == 200 && (r.ErrorType == nil || *r.ErrorType != "sandbox" || !strings.Contains(r.Stderr, "agent")) || s != 200 && s != 409 {
		t.Fatalf("the exec that killed the agent: %d %v", s, r)
	}
	s, b := call(t, "GET", sb.url, "", "X-Sandbox-Lease", sb.token)
	var info struct {
		Status       string `json:"status"`
		StatusReason string `json:"status_reason"`
	}
	if json.Unmarshal(b, &info); s != 200 || info.Status != "error" || !strings.Contains(info.StatusReason, "agent") {
		t.Fatalf("sandbox after its agent was killed: %d %s", s, b)
	}
	start := time.Now()
	s, r, err = dkExec(ctx, sb, "true", false)
	if err != nil || s != 409 {
		t.Fatalf("exec in a sandbox in error: %v %d %v", err, s, r)
	}
	if s, b := call(t, "POST", sb.url+"/pty", `{"pty":true}`, "X-Sandbox-Lease", sb.token); s != 409 {
		t.Fatalf("terminal in a sandbox in error: %d %s", s, b)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatalf("calls on a sandbox in error took %v", time.Since(start))
	}
	if s, b := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
		t.Fatalf("delete: %d %s", s, b)
	}
}
