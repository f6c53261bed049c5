// Package terminals is the terminal-session suite every provider that
// runs terminals passes: Run drives the whole stack (the gateway's
// handlers over loopback HTTP, the service, the terminal manager, real
// WebSocket dials) over the provider's own sandboxes and processes (local:
// real namespaces; docker: containers and their agent). Nothing is faked.
package terminals

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	u8 "unicode/utf8"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/handlers"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
	"github.com/sandgate/sandgate/internal/wire"
)

// Run runs the suite on p. create holds the create-request fields p's
// sandboxes need (docker: image). Each test has a gateway of its own (a
// terminal manager and its handlers) on the suite's one sandbox service
// and deletes what it made, so they run in parallel (most of their time
// is spent waiting for a sandbox); the ones whose subject is a deadline
// against a healthy client (marked serial) run first, alone. (A service
// per test would take the others' sandboxes, which its store has no
// record of, for orphans, and delete them.)
func Run(t *testing.T, p providers.Provider, create map[string]any) {
	svc, err := sandbox.New(context.Background(), sandbox.Options{
		Provider: p, StateDir: t.TempDir(), APIKeys: []string{apiKey}, ReapInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	s := &suite{p: p, svc: svc, create: create}
	for _, c := range []struct {
		name   string
		fn     func(*testing.T, *suite)
		serial bool
	}{
		{"PTYShellEchoAndResize", testPTYShellEchoAndResize, false},
		{"PTYReattachSinceLosesNothing", testPTYReattachSinceLosesNothing, false},
		{"PTYReplayClampsToRing", testPTYReplayClampsToRing, false},
		{"PTYTakeover", testPTYTakeover, false},
		{"PTYManyTakeovers", testPTYManyTakeovers, false},
		{"PTYSlowClientDropped", testPTYSlowClientDropped, true},
		{"PTYExitWhileDetached", testPTYExitWhileDetached, false},
		{"PipeMode", testPipeMode, false},
		{"PTYModeAtFirstAttach", testPTYModeAtFirstAttach, false},
		{"PTYSignalForegroundGroup", testPTYSignalForegroundGroup, false},
		{"PTYUTF8SplitAcrossReads", testPTYUTF8SplitAcrossReads, false},
		{"PTYMarkerDelimitedExec", testPTYMarkerDelimitedExec, false},
		{"PTYConcurrentSessions", testPTYConcurrentSessions, false},
		{"PTYSessionLimitUnderConcurrency", testPTYSessionLimitUnderConcurrency, false},
		{"PTYBadInput", testPTYBadInput, false},
		{"PTYBrowserAuthAndOrigin", testPTYBrowserAuthAndOrigin, false},
		{"PTYSessionGone", testPTYSessionGone, false},
		{"PTYShutdownAndSilentClient", testPTYShutdownAndSilentClient, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !c.serial {
				t.Parallel()
			}
			c.fn(t, s)
		})
	}
}

type suite struct {
	p      providers.Provider
	svc    *sandbox.Service
	create map[string]any
}

const apiKey = "terminaltest-key"

// ptyEnv is a gateway with one sandbox.
type ptyEnv struct {
	t     *testing.T
	srv   *httptest.Server
	svc   *sandbox.Service
	mgr   *pty.Manager
	base  map[string]any // create fields the provider needs
	id    string
	token string
}

// env starts a gateway with manager options o on the suite's service and
// creates a sandbox. Cleanup closes the manager (clients get 1001),
// deletes the sandbox and stops the gateway.
func (s *suite) env(t *testing.T, o pty.Options) *ptyEnv {
	t.Helper()
	svc := s.svc
	mgr := pty.NewManager(svc, o)
	h, err := handlers.New(handlers.Options{Service: svc, PTY: mgr, PublicURL: "http://gw.example:9"})
	if err != nil {
		t.Fatal(err)
	}
	e := &ptyEnv{t: t, srv: httptest.NewServer(h), svc: svc, mgr: mgr, base: s.create}
	t.Cleanup(func() {
		mgr.Close()
		if e.id != "" {
			e.do("DELETE", "/v1/sandboxes/"+e.id, nil, key())
		}
		e.srv.Close()
	})
	r := e.create(nil)
	e.id, e.token = r.SandboxID, r.Token
	return e
}

// resp is an HTTP answer with its body read.
type resp struct {
	*http.Response
	body []byte
}

// json decodes the body into v.
func (r resp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.NewDecoder(bytes.NewReader(r.body)).Decode(v); err != nil {
		t.Fatalf("%d %s: %v", r.StatusCode, r.body, err)
	}
}

// problem checks that r is an RFC 9457 problem and returns its code.
func (r resp) problem(t *testing.T) struct{ Code string } {
	t.Helper()
	var p struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	}
	if r.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("not a problem: %d %s", r.StatusCode, r.body)
	}
	r.json(t, &p)
	if p.Status != r.StatusCode || p.Code == "" {
		t.Fatalf("incomplete problem: %s", r.body)
	}
	return struct{ Code string }{p.Code}
}

// do sends a request with the headers in hdr and body: none (nil), as
// it is (a string), or as JSON.
func (e *ptyEnv) do(method, path string, body any, hdr map[string]string) resp {
	e.t.Helper()
	var payload io.Reader
	if raw, ok := body.(string); ok {
		payload = strings.NewReader(raw)
	} else if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		payload = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, payload)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{res, b}
}

func key() map[string]string { return map[string]string{"Authorization": "Bearer " + apiKey} }

func lease(tok string) map[string]string { return map[string]string{"X-Sandbox-Lease": tok} }

type ref struct {
	SandboxID string `json:"sandbox_id"`
	Token     string `json:"lease_token"`
}

// create creates a sandbox from body plus the fields the provider needs.
func (e *ptyEnv) create(body map[string]any) ref {
	e.t.Helper()
	b := maps.Clone(e.base)
	if b == nil {
		b = map[string]any{}
	}
	maps.Copy(b, body)
	r := e.do("POST", "/v1/sandboxes", b, key())
	if r.StatusCode != 201 {
		e.t.Fatalf("create: %d %s", r.StatusCode, r.body)
	}
	var out ref
	r.json(e.t, &out)
	return out
}

// session starts a terminal session and returns its id.
func (e *ptyEnv) session(body map[string]any) string {
	e.t.Helper()
	r := e.do("POST", "/v1/sandboxes/"+e.id+"/pty", body, lease(e.token))
	if r.StatusCode != 201 {
		e.t.Fatalf("create session: %d %s", r.StatusCode, r.body)
	}
	var out struct {
		SessionID string `json:"session_id"`
	}
	r.json(e.t, &out)
	return out.SessionID
}

type sessionInfo struct {
	SessionID    string `json:"session_id"`
	Running      bool   `json:"running"`
	OutputOffset int64  `json:"output_offset"`
	ExitCode     *int   `json:"exit_code"`
	Mode         string `json:"mode"`
	Attached     bool   `json:"attached"`
}

func (e *ptyEnv) info(sid string) sessionInfo {
	e.t.Helper()
	r := e.do("GET", "/v1/sandboxes/"+e.id+"/pty/"+sid, nil, lease(e.token))
	if r.StatusCode != 200 {
		e.t.Fatalf("get session: %d %s", r.StatusCode, r.body)
	}
	var i sessionInfo
	r.json(e.t, &i)
	return i
}

// exec runs command in the sandbox and returns its stdout.
func (e *ptyEnv) exec(command string) string {
	e.t.Helper()
	r := e.do("POST", "/v1/sandboxes/"+e.id+"/exec", map[string]any{"command": command}, lease(e.token))
	var out struct {
		Stdout string `json:"stdout"`
	}
	if r.StatusCode != 200 {
		e.t.Fatalf("exec: %d %s", r.StatusCode, r.body)
	}
	r.json(e.t, &out)
	return out.Stdout
}

func (e *ptyEnv) wsURL(sid, query string) string {
	u := "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/v1/sandboxes/" + e.id + "/pty/" + sid + "/ws"
	if query != "" {
		u += "?" + query
	}
	return u
}

// frame is one message a client received.
type frame struct {
	text bool
	data []byte
}

// wsClient is a test client. Its reader goroutine (started by read)
// collects frames until the connection ends.
type wsClient struct {
	t      *testing.T
	conn   *websocket.Conn
	frames chan frame
	done   chan struct{}
	err    error // why reading stopped; valid after done
}

// dial attaches with the lease in a header; the test fails on error.
func (e *ptyEnv) dial(sid, query string) *wsClient {
	e.t.Helper()
	c, res, err := e.tryDial(sid, query, http.Header{"X-Sandbox-Lease": {e.token}}, nil)
	if err != nil {
		status := 0
		if res != nil {
			status = res.StatusCode
		}
		e.t.Fatalf("dial %s?%s: %v (HTTP %d)", sid, query, err, status)
	}
	c.read()
	return c
}

func (e *ptyEnv) tryDial(sid, query string, hdr http.Header, protos []string) (*wsClient, *http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, res, err := websocket.Dial(ctx, e.wsURL(sid, query), &websocket.DialOptions{HTTPHeader: hdr, Subprotocols: protos})
	if err != nil {
		return nil, res, err
	}
	conn.SetReadLimit(-1)
	c := &wsClient{t: e.t, conn: conn, frames: make(chan frame, 1<<16), done: make(chan struct{})}
	e.t.Cleanup(func() { conn.CloseNow(); c.wait() })
	return c, res, nil
}

// read starts the reader goroutine.
func (c *wsClient) read() {
	go func() {
		defer close(c.done)
		defer close(c.frames)
		for {
			typ, b, err := c.conn.Read(context.Background())
			if err != nil {
				c.err = err
				return
			}
			c.frames <- frame{typ == websocket.MessageText, b}
		}
	}()
}

func (c *wsClient) wait() {
	select {
	case <-c.done:
	case <-time.After(15 * time.Second):
		c.t.Errorf("client reader did not end")
	}
}

// closeCode waits for the connection to end and returns its close code.
func (c *wsClient) closeCode() websocket.StatusCode {
	c.t.Helper()
	for range c.frames {
	}
	c.wait()
	return websocket.CloseStatus(c.err)
}

func (c *wsClient) send(typ websocket.MessageType, b []byte) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.conn.Write(ctx, typ, b); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

func (c *wsClient) stdin(s string) { c.send(websocket.MessageBinary, append([]byte{0}, s...)) }

func (c *wsClient) json(v any) {
	b, _ := json.Marshal(v)
	c.send(websocket.MessageText, b)
}

// stream is what a client has seen so far.
type stream struct {
	out, errOut []byte // channel 1 (and replay) / channel 2
	start       int64  // absolute offset of out[0], from the replay frame
	replays     int
	texts       []wire.ServerMsg
}

func (s *stream) add(t *testing.T, f frame) {
	if f.text {
		var m wire.ServerMsg
		if err := json.Unmarshal(f.data, &m); err != nil {
			t.Fatalf("bad text frame %q: %v", f.data, err)
		}
		s.texts = append(s.texts, m)
		return
	}
	sf, err := wire.DecodeServer(f.data)
	if err != nil {
		t.Fatalf("bad binary frame: %v", err)
	}
	switch sf.Channel {
	case wire.ChanReplay:
		if s.replays > 0 || len(s.out) > 0 || len(s.texts) > 0 {
			t.Fatalf("replay frame not first")
		}
		s.replays++
		s.start = sf.Offset
		s.out = append(s.out, sf.Data...)
	case wire.ChanOutput:
		s.out = append(s.out, sf.Data...)
	case wire.ChanStderr:
		s.errOut = append(s.errOut, sf.Data...)
	}
}

func (s *stream) hasText(typ string) *wire.ServerMsg {
	for i := range s.texts {
		if s.texts[i].Type == typ {
			return &s.texts[i]
		}
	}
	return nil
}

// until reads frames into s until cond holds; it fails after d.
func (c *wsClient) until(s *stream, d time.Duration, what string, cond func(*stream) bool) {
	c.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for !cond(s) {
		select {
		case f, ok := <-c.frames:
			if !ok {
				c.t.Fatalf("connection ended (%v) before %s; output so far: %q", c.err, what, tail(s.out))
			}
			s.add(c.t, f)
		case <-timer.C:
			c.t.Fatalf("timed out waiting for %s; output so far: %q", what, tail(s.out))
		}
	}
}

func tail(b []byte) []byte {
	if len(b) > 400 {
		return b[len(b)-400:]
	}
	return b
}

func outContains(sub string) func(*stream) bool {
	return func(s *stream) bool { return bytes.Contains(s.out, []byte(sub)) }
}

func connected(s *stream) bool { return s.hasText("connected") != nil }

// 1. A shell session: type a command and read it back; a resize sent as
// JSON shows in stty size.
func testPTYShellEchoAndResize(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{})
	c := e.dial(sid, "")
	var s stream
	c.until(&s, 10*time.Second, "connected", connected)
	if m := s.hasText("connected"); m.SessionID != sid || m.Mode != wire.ModePTY {
		t.Fatalf("connected frame %+v", m)
	}
	c.stdin("echo h\"\"i\n")
	c.until(&s, 10*time.Second, "hi", outContains("hi\r\n"))
	c.json(map[string]any{"type": "resize", "cols": 132, "rows": 43})
	c.stdin("stty size\n")
	c.until(&s, 10*time.Second, "43 132", outContains("43 132"))
	c.stdin("tty\n")
	c.until(&s, 10*time.Second, "a tty of the sandbox's own devpts", outContains("/dev/pts/"))
	if i := e.info(sid); !i.Running || !i.Attached || i.Mode != "pty" || i.OutputOffset == 0 || i.ExitCode != nil {
		t.Fatalf("session info %+v", i)
	}
}

func seqOutput(n int, eol string) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d%s", i, eol)
	}
	return b.Bytes()
}

// 2. Drop the connection while output keeps coming; re-attaching with
// since = bytes received gives exactly the rest.
func testPTYReattachSinceLosesNothing(t *testing.T, ts *suite) {
	// The ring holds the whole output, so whatever the timing, nothing
	// the client missed has left it.
	e := ts.env(t, pty.Options{RingBytes: 8 << 20})
	sid := e.session(map[string]any{"command": "sleep 0.3; seq 1 200000"})
	want := seqOutput(200000, "\r\n")

	c := e.dial(sid, "")
	var s1 stream
	c.until(&s1, 20*time.Second, "some output", func(s *stream) bool { return len(s.out) > 50000 })
	c.conn.CloseNow()
	got := s1.out
	if s1.start != 0 {
		t.Fatalf("first attach replay offset %d", s1.start)
	}

	c2 := e.dial(sid, fmt.Sprintf("since=%d&takeover=1", len(got)))
	var s2 stream
	c2.until(&s2, 30*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if s2.replays == 1 && s2.start != int64(len(got)) {
		t.Fatalf("re-attach replay starts at %d, want %d", s2.start, len(got))
	}
	got = append(got, s2.out...)
	if !bytes.Equal(got, want) {
		t.Fatalf("concatenated output differs: got %d bytes, want %d (first difference at %d)", len(got), len(want), firstDiff(got, want))
	}
	if code := c2.closeCode(); code != websocket.StatusNormalClosure {
		t.Fatalf("close code %v, want 1000", code)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// 3. After more than the ring of output, since=0 replays the last 1 MiB
// from offset total - 1 MiB.
func testPTYReplayClampsToRing(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{"command": "seq 1 400000", "pty": false})
	want := seqOutput(400000, "\n")
	testkit.Eventually(t, "the process to exit", 20*time.Second, func() bool { return !e.info(sid).Running })
	if i := e.info(sid); i.OutputOffset != int64(len(want)) {
		t.Fatalf("output_offset %d, want %d", i.OutputOffset, len(want))
	}

	c := e.dial(sid, "since=0")
	var s stream
	c.until(&s, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	const ring = 1 << 20
	if s.replays != 1 || s.start != int64(len(want)-ring) {
		t.Fatalf("replay offset %d (%d replay frames), want %d", s.start, s.replays, len(want)-ring)
	}
	if !bytes.Equal(s.out, want[len(want)-ring:]) {
		t.Fatalf("replay is not the last 1 MiB (%d bytes)", len(s.out))
	}

	// since at the total: no replay frame at all.
	c2 := e.dial(sid, fmt.Sprintf("since=%d", len(want)))
	var s2 stream
	c2.until(&s2, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if s2.replays != 0 || len(s2.out) != 0 || s2.texts[0].Type != "connected" {
		t.Fatalf("since=total: %d replay frames, %d bytes, first text %+v", s2.replays, len(s2.out), s2.texts[0])
	}
}

// 4. One holder: a second attach is refused with 409 before the upgrade;
// with takeover the holder gets 4001 and the newcomer the replay and live
// output.
func testPTYTakeover(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{})
	a := e.dial(sid, "")
	var sa stream
	a.stdin("echo fi\"\"rst\n")
	a.until(&sa, 10*time.Second, "first", outContains("first\r\n"))

	_, res, err := e.tryDial(sid, "", http.Header{"X-Sandbox-Lease": {e.token}}, nil)
	if err == nil || res == nil || res.StatusCode != http.StatusConflict {
		t.Fatalf("second attach: %v, %v", err, res)
	}
	var p struct{ Code string }
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil || p.Code != "ALREADY_CONNECTED" {
		t.Fatalf("409 body: %+v, %v", p, err)
	}

	// The bound catches a hang only: a takeover is prompt (well under a
	// second), but a loaded machine must not fail it.
	b := e.dial(sid, "takeover=1")
	var sb stream
	b.until(&sb, 10*time.Second, "connected after the takeover", connected)
	if code := a.closeCode(); code != wire.CloseTakenOver {
		t.Fatalf("evicted client got close %v (%v), want 4001", code, a.err)
	}
	if sb.replays != 1 || !bytes.Contains(sb.out, []byte("first\r\n")) {
		t.Fatalf("newcomer's replay: %q", sb.out)
	}
	b.stdin("echo sec\"\"ond\n")
	b.until(&sb, 10*time.Second, "second", outContains("second\r\n"))
}

// 8b. 200 takeovers in a row: every evicted client receives 4001.
func testPTYManyTakeovers(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{"command": "while :; do echo tick; sleep 0.01; done"})
	prev := e.dial(sid, "")
	for i := 0; i < 200; i++ {
		next := e.dial(sid, "takeover=1")
		if code := prev.closeCode(); code != wire.CloseTakenOver {
			t.Fatalf("takeover %d: evicted client got %v (%v), want 4001", i, code, prev.err)
		}
		prev = next
	}
	var s stream
	prev.until(&s, 10*time.Second, "live output", outContains("tick"))
}

// 5. A client that never reads is closed with 1008; the process keeps
// running and another client attaches normally.
func testPTYSlowClientDropped(t *testing.T, ts *suite) {
	// About 4 MB/s in bursts of 100 KB: a reading client keeps up, even
	// under the race detector; one that does not read fills its TCP
	// buffers and then its queue within seconds.
	// The writer stays blocked on the slow client's full socket until it
	// reads at the end: a write timeout that ran out first would cut the
	// connection without its 1008 on a loaded machine.
	e := ts.env(t, pty.Options{QueueBytes: 1 << 20, WriteTimeout: 2 * time.Minute})
	sid := e.session(map[string]any{"command": "while :; do seq 1 20000; sleep 0.02; done", "pty": false})
	// One bound for the slow client's whole life (dial, drop, final
	// read), wide enough to only catch a hang.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	slow, _, err := websocket.Dial(ctx, e.wsURL(sid, ""), &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {e.token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.CloseNow()
	testkit.Eventually(t, "the slow client to be detached", 30*time.Second, func() bool { return !e.info(sid).Attached })
	before := e.info(sid)
	if !before.Running {
		t.Fatal("the process stopped")
	}

	// Another client attaches without takeover and gets live output.
	c := e.dial(sid, "")
	var s stream
	c.until(&s, 10*time.Second, "live output", func(s *stream) bool { return len(s.out) > 1<<20 })
	if after := e.info(sid); !after.Running || after.OutputOffset <= before.OutputOffset {
		t.Fatalf("process stalled: %+v then %+v", before, after)
	}

	// The slow client, reading at last, finds the 1008 close.
	slow.SetReadLimit(-1)
	for {
		_, _, err := slow.Read(ctx)
		if err != nil {
			if code := websocket.CloseStatus(err); code != websocket.StatusPolicyViolation {
				t.Fatalf("slow client closed with %v (%v), want 1008", code, err)
			}
			break
		}
	}
	e.do("DELETE", "/v1/sandboxes/"+e.id+"/pty/"+sid, nil, lease(e.token))
}

// 6. The process exits while nobody is attached; a later attach gets the
// replay, the exit frame and close 1000. (A create that names its mode
// starts the process at once.)
func testPTYExitWhileDetached(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{"command": "echo bye; exit 3", "pty": true})
	testkit.Eventually(t, "the process to exit", 10*time.Second, func() bool { return !e.info(sid).Running })
	if i := e.info(sid); i.ExitCode == nil || *i.ExitCode != 3 || i.Attached {
		t.Fatalf("session info %+v", i)
	}
	c := e.dial(sid, "")
	var s stream
	c.until(&s, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if s.replays != 1 || string(s.out) != "bye\r\n" {
		t.Fatalf("replay %q (%d frames)", s.out, s.replays)
	}
	if len(s.texts) != 2 || s.texts[0].Type != "connected" || s.texts[1].Type != "exit" || *s.texts[1].ExitCode != 3 {
		t.Fatalf("text frames %+v", s.texts)
	}
	if code := c.closeCode(); code != websocket.StatusNormalClosure {
		t.Fatalf("close %v, want 1000", code)
	}
}

// 7. Pipe mode: stdout on channel 1, stderr on channel 2, eof closes
// stdin.
func testPipeMode(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	// It waits for a line, so that its output comes live rather than in
	// the replay (which merges the streams).
	sid := e.session(map[string]any{"command": "read go; echo out; echo err >&2; cat", "pty": false})
	c := e.dial(sid, "pty=0")
	var s stream
	c.until(&s, 10*time.Second, "connected", connected)
	c.stdin("go\n")
	c.until(&s, 10*time.Second, "out and err", func(s *stream) bool {
		return connected(s) && bytes.Contains(s.out, []byte("out\n")) && bytes.Contains(s.errOut, []byte("err\n"))
	})
	if m := s.hasText("connected"); m.Mode != wire.ModePipe {
		t.Fatalf("mode %q", m.Mode)
	}
	c.stdin("hello\n")
	c.json(map[string]any{"type": "stdin", "data": "wörld\n"})
	c.until(&s, 10*time.Second, "echoed stdin", outContains("hello\nwörld\n"))
	c.json(map[string]any{"type": "eof"})
	c.until(&s, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if m := s.hasText("exit"); *m.ExitCode != 0 {
		t.Fatalf("exit %d", *m.ExitCode)
	}
	if bytes.Contains(s.out, []byte("err")) {
		t.Fatalf("stderr leaked into stdout: %q", s.out)
	}
	if code := c.closeCode(); code != websocket.StatusNormalClosure {
		t.Fatalf("close %v", code)
	}
}

// 7b. A create that names no mode (OpenSandbox execd's clients, NeMo Gym's
// among them) starts its process at the first attach, in the mode that
// attach asks for: ?pty=0 gets pipes (stdout and stderr apart, the exit
// code), no ?pty a terminal. A session deleted before any attach never
// starts.
func testPTYModeAtFirstAttach(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	// Gym's PTY client with pty=False: the shell, pipe mode on attach,
	// commands on stdin.
	sid := e.session(map[string]any{})
	if i := e.info(sid); !i.Running || i.OutputOffset != 0 || i.Mode != "pty" {
		t.Fatalf("before the first attach: %+v", i)
	}
	c := e.dial(sid, "pty=0")
	var s stream
	c.until(&s, 10*time.Second, "connected", connected)
	if m := s.hasText("connected"); m.Mode != wire.ModePipe {
		t.Fatalf("mode %q, want pipe", m.Mode)
	}
	c.stdin("echo out; echo err >&2; exit 3\n")
	c.until(&s, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if string(s.out) != "out\n" || string(s.errOut) != "err\n" || *s.hasText("exit").ExitCode != 3 {
		t.Fatalf("pipe mode: out %q err %q exit %+v", s.out, s.errOut, s.hasText("exit"))
	}
	if i := e.info(sid); i.Mode != "pipe" {
		t.Fatalf("after: %+v", i)
	}

	// No ?pty: a terminal, as before.
	sid = e.session(map[string]any{"command": "echo out; echo err >&2; tty >/dev/null && echo tty"})
	c = e.dial(sid, "")
	s = stream{}
	c.until(&s, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if m := s.hasText("connected"); m.Mode != wire.ModePTY || string(s.out) != "out\r\nerr\r\ntty\r\n" || len(s.errOut) != 0 {
		t.Fatalf("pty mode %q: out %q err %q", m.Mode, s.out, s.errOut)
	}
	// A later ?pty=0 changes nothing: the process runs in its mode.
	c = e.dial(sid, "pty=0")
	s = stream{}
	c.until(&s, 10*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	if m := s.hasText("connected"); m.Mode != wire.ModePTY {
		t.Fatalf("re-attach with pty=0: mode %q", m.Mode)
	}

	// Deleted before its first attach: it never ran.
	sid = e.session(map[string]any{"command": "touch /tmp/deferred-ran"})
	if r := e.do("DELETE", "/v1/sandboxes/"+e.id+"/pty/"+sid, nil, lease(e.token)); r.StatusCode != 200 {
		t.Fatalf("delete: %d %s", r.StatusCode, r.body)
	}
	if r := e.do("GET", "/v1/sandboxes/"+e.id+"/pty/"+sid, nil, lease(e.token)); r.StatusCode != 404 {
		t.Fatalf("get after delete: %d", r.StatusCode)
	}
	if out := e.exec("test -e /tmp/deferred-ran && echo ran || echo never"); out != "never\n" {
		t.Fatalf("a session deleted before its attach: %q", out)
	}
}

// sleeping100 exits 0 when a process with the command line "sleep 100"
// runs in the sandbox.
const sleeping100 = `for f in /proc/[0-9]*/cmdline; do [ "$(tr '\0' ' ' < "$f" 2>/dev/null)" = "sleep 100 " ] && exit 0; done; exit 1`

// 8. SIGINT goes to the terminal's foreground group: it interrupts sleep
// typed into the shell, which survives; also when the gateway ignores
// SIGINT. Unknown signals get an error frame and change nothing.
func testPTYSignalForegroundGroup(t *testing.T, ts *suite) {
	for _, ignored := range []bool{false, true} {
		t.Run(fmt.Sprintf("gateway-ignores-SIGINT=%v", ignored), func(t *testing.T) {
			if ignored {
				// Sandboxes made now inherit the ignored SIGINT, as from a
				// gateway started with it ignored.
				signal.Ignore(syscall.SIGINT)
				defer signal.Reset(syscall.SIGINT)
			}
			e := ts.env(t, pty.Options{})
			sid := e.session(map[string]any{})
			c := e.dial(sid, "")
			var s stream
			c.stdin("sleep 100\n")
			// No pgrep in every sandbox (busybox-static has none), and a
			// docker sandbox's keep-alive is a sleep too: look for this
			// one by its whole command line.
			testkit.Eventually(t, "sleep to run", 10*time.Second, func() bool {
				r := e.do("POST", "/v1/sandboxes/"+e.id+"/exec", map[string]any{"command": sleeping100}, lease(e.token))
				var res struct {
					ReturnCode int `json:"return_code"`
				}
				r.json(t, &res)
				return res.ReturnCode == 0
			})
			c.json(map[string]any{"type": "signal", "signal": "SIGINT"})
			c.stdin("echo al\"\"ive $?\n")
			c.until(&s, 10*time.Second, "the shell to report 130", outContains("alive 130"))

			c.json(map[string]any{"type": "signal", "signal": "SIGFOO"})
			c.until(&s, 10*time.Second, "an error frame", func(s *stream) bool { return s.hasText("error") != nil })
			if m := s.hasText("error"); m.Code != wire.CodeUnknownSignal {
				t.Fatalf("error frame %+v", m)
			}
			c.stdin("echo st\"\"ill $$\n")
			c.until(&s, 10*time.Second, "the shell to live on", outContains("still "))
			if !e.info(sid).Running {
				t.Fatal("the shell died")
			}
		})
	}
}

// 9. Multi-byte UTF-8 split across reads arrives intact.
func testPTYUTF8SplitAcrossReads(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{
		"command": `printf '\342\202'; sleep 0.3; printf '\254\n'; i=0; while [ $i -lt 20000 ]; do printf '€'; i=$((i+1)); done`,
		"pty":     false,
	})
	c := e.dial(sid, "")
	var s stream
	c.until(&s, 60*time.Second, "exit", func(s *stream) bool { return s.hasText("exit") != nil })
	want := "€\n" + strings.Repeat("€", 20000)
	if string(s.out) != want || !u8.Valid(s.out) {
		t.Fatalf("got %d bytes (valid UTF-8: %v), want %d", len(s.out), u8.Valid(s.out), len(want))
	}
}

// 10. A marker-delimited exec as NeMo Gym's PTY client does it.
func testPTYMarkerDelimitedExec(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{})
	c := e.dial(sid, "")
	var s stream
	c.stdin("{ echo out; false\n} </dev/null\nprintf '%s%s:%s\\n' 'NGPTY' 'abc123def456' \"$?\"\n")
	c.until(&s, 10*time.Second, "the marker", outContains("NGPTYabc123def456:1"))
	if !bytes.Contains(s.out, []byte("out\r\n")) {
		t.Fatalf("no command output before the marker: %q", s.out)
	}
}

// 11. 200 concurrent sessions each echo a unique token.
func testPTYConcurrentSessions(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.echoToken(i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// 11b. Concurrent creates never overshoot the per-sandbox session limit
// (each holds its slot while its process starts): exactly the limit get
// 201, the others 429; deleting a session frees a slot.
func testPTYSessionLimitUnderConcurrency(t *testing.T, ts *suite) {
	const limit, n = 4, 16
	e := ts.env(t, pty.Options{MaxPerSandbox: limit})
	status := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status[i] = e.do("POST", "/v1/sandboxes/"+e.id+"/pty", map[string]any{"command": "sleep 300"}, lease(e.token)).StatusCode
		}()
	}
	wg.Wait()
	counts := map[int]int{}
	for _, s := range status {
		counts[s]++
	}
	if counts[201] != limit || counts[429] != n-limit {
		t.Fatalf("%d concurrent creates with a limit of %d: statuses %v", n, limit, counts)
	}
	r := e.do("GET", "/v1/sandboxes/"+e.id+"/pty", nil, lease(e.token))
	var list struct{ Sessions []sessionInfo }
	r.json(t, &list)
	if len(list.Sessions) != limit {
		t.Fatalf("%d sessions listed, want %d", len(list.Sessions), limit)
	}
	if r := e.do("DELETE", "/v1/sandboxes/"+e.id+"/pty/"+list.Sessions[0].SessionID, nil, lease(e.token)); r.StatusCode != 200 {
		t.Fatalf("delete session: %d %s", r.StatusCode, r.body)
	}
	e.session(map[string]any{"command": "sleep 300"})
}

// echoToken runs one session that echoes a token; it reports instead of
// failing, as it runs off the test goroutine.
func (e *ptyEnv) echoToken(i int) error {
	r := e.do("POST", "/v1/sandboxes/"+e.id+"/pty", map[string]any{"command": "sh"}, lease(e.token))
	var cr struct {
		SessionID string `json:"session_id"`
	}
	if r.StatusCode != 201 || json.Unmarshal(r.body, &cr) != nil {
		return fmt.Errorf("session %d: create %d %s", i, r.StatusCode, r.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, e.wsURL(cr.SessionID, ""), &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {e.token}}})
	if err != nil {
		return fmt.Errorf("session %d: dial: %w", i, err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(-1)
	if err := conn.Write(ctx, websocket.MessageBinary, fmt.Appendf([]byte{0}, "echo tok\"\"en-%d-x\n", i)); err != nil {
		return fmt.Errorf("session %d: %w", i, err)
	}
	want := []byte(fmt.Sprintf("token-%d-x", i))
	var out []byte
	for !bytes.Contains(out, want) {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("session %d: read: %w (got %q)", i, err, out)
		}
		if typ == websocket.MessageBinary && len(b) > 0 {
			sf, err := wire.DecodeServer(b)
			if err != nil {
				return err
			}
			out = append(out, sf.Data...)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
	return nil
}

// 12. Bad input gets its documented error and breaks nothing.
func testPTYBadInput(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{MaxFrame: 4096})
	sid := e.session(map[string]any{})
	hdr := http.Header{"X-Sandbox-Lease": {e.token}}
	for _, q := range []string{"since=abc", "since=-1", "since=1.5", "takeover=maybe", "pty=2"} {
		_, res, err := e.tryDial(sid, q, hdr, nil)
		if err == nil || res == nil || res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %v %v", q, err, res)
		}
	}
	_, res, err := e.tryDial("pty-nosuchsession", "", hdr, nil)
	if err == nil || res == nil || res.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown session: %v %v", err, res)
	}
	var p struct{ Code string }
	json.NewDecoder(res.Body).Decode(&p)
	if p.Code != "CONTEXT_NOT_FOUND" {
		t.Fatalf("unknown session code %q", p.Code)
	}
	for _, m := range []string{"GET", "DELETE"} {
		r := e.do(m, "/v1/sandboxes/"+e.id+"/pty/pty-nosuchsession", nil, lease(e.token))
		if r.StatusCode != 404 || r.problem(t).Code != "CONTEXT_NOT_FOUND" {
			t.Fatalf("%s unknown session: %d %s", m, r.StatusCode, r.body)
		}
	}
	r := e.do("POST", "/v1/sandboxes/"+e.id+"/pty", map[string]any{"rows": 0}, lease(e.token))
	if r.StatusCode != 422 && r.StatusCode != 400 {
		t.Fatalf("rows 0: %d %s", r.StatusCode, r.body)
	}
	r = e.do("POST", "/v1/sandboxes/"+e.id+"/pty", `{"command":`, lease(e.token))
	if r.StatusCode != 400 {
		t.Fatalf("malformed body: %d %s", r.StatusCode, r.body)
	}

	c := e.dial(sid, "")
	var s stream
	wantErr := func(code string) {
		t.Helper()
		n := len(s.texts)
		c.until(&s, 10*time.Second, "error "+code, func(s *stream) bool {
			for _, m := range s.texts[n:] {
				if m.Type == "error" {
					return true
				}
			}
			return false
		})
		for _, m := range s.texts[n:] {
			if m.Type == "error" && m.Code != code {
				t.Fatalf("error frame %+v, want %s", m, code)
			}
		}
	}
	c.send(websocket.MessageBinary, append([]byte{0}, bytes.Repeat([]byte("x"), 10000)...))
	wantErr(wire.CodeFrameTooLarge)
	c.send(websocket.MessageText, []byte(`{"type":"resize","cols":`))
	wantErr(wire.CodeInvalidFrame)
	c.send(websocket.MessageBinary, []byte{0x07, 'x'})
	wantErr(wire.CodeUnknownChannel)
	c.send(websocket.MessageText, []byte(`{"type":"launch-missiles"}`))
	wantErr(wire.CodeUnknownType)
	c.send(websocket.MessageText, []byte(`{"type":"resize","cols":0,"rows":5}`))
	wantErr(wire.CodeInvalidFrame)
	c.json(map[string]any{"type": "ping"})
	c.until(&s, 10*time.Second, "pong", func(s *stream) bool { return s.hasText("pong") != nil })
	c.stdin("echo o\"\"k\n")
	c.until(&s, 10*time.Second, "the session to still work", outContains("ok\r\n"))
}

// Browsers: lease as subprotocol (echoed) or ?lease=; Origin checked.
func testPTYBrowserAuthAndOrigin(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{AllowedOrigins: []string{"https://*.example.com"}})
	sid := e.session(map[string]any{})

	proto := "sandgate.lease." + e.token
	c, _, err := e.tryDial(sid, "", nil, []string{proto})
	if err != nil {
		t.Fatal(err)
	}
	if c.conn.Subprotocol() != proto {
		t.Fatalf("subprotocol %q not echoed", c.conn.Subprotocol())
	}
	c.read()
	var s stream
	c.until(&s, 10*time.Second, "connected", connected)
	c.conn.Close(websocket.StatusNormalClosure, "")
	c.closeCode()

	for _, tc := range []struct {
		query  string
		hdr    http.Header
		status int
	}{
		{"", nil, 401},
		{"lease=bogus", nil, 401},
		{"takeover=1&lease=" + e.token, http.Header{"Origin": {"https://evil.test"}}, 403},
		{"takeover=1&lease=" + e.token, http.Header{"Origin": {"http://app.example.com"}}, 403},
	} {
		_, res, err := e.tryDial(sid, tc.query, tc.hdr, nil)
		if err == nil || res == nil || res.StatusCode != tc.status {
			t.Fatalf("%q %v: %v %v, want %d", tc.query, tc.hdr, err, res, tc.status)
		}
	}
	for _, origin := range []string{"https://app.example.com", strings.Replace(e.srv.URL, "127.0.0.1", "127.0.0.1", 1)} {
		c, res, err := e.tryDial(sid, "takeover=1&lease="+e.token, http.Header{"Origin": {origin}}, nil)
		if err != nil {
			t.Fatalf("origin %s: %v %v", origin, err, res)
		}
		c.read()
		var s stream
		c.until(&s, 10*time.Second, "connected", connected)
	}
}

// Deleting the sandbox ends its sessions: the client gets SESSION_GONE
// and 1001; deleting a session likewise, and it is forgotten.
func testPTYSessionGone(t *testing.T, ts *suite) {
	e := ts.env(t, pty.Options{})
	sid := e.session(map[string]any{})
	c := e.dial(sid, "")
	var s stream
	c.until(&s, 10*time.Second, "connected", connected)
	if r := e.do("DELETE", "/v1/sandboxes/"+e.id+"/pty/"+sid, nil, lease(e.token)); r.StatusCode != 200 {
		t.Fatalf("delete session: %d %s", r.StatusCode, r.body)
	}
	c.until(&s, 10*time.Second, "SESSION_GONE", func(s *stream) bool { return s.hasText("error") != nil })
	if code := c.closeCode(); code != websocket.StatusGoingAway {
		t.Fatalf("close %v, want 1001", code)
	}
	if r := e.do("GET", "/v1/sandboxes/"+e.id+"/pty/"+sid, nil, lease(e.token)); r.StatusCode != 404 {
		t.Fatalf("deleted session still there: %d", r.StatusCode)
	}

	sid2 := e.session(map[string]any{})
	c2 := e.dial(sid2, "")
	var s2 stream
	c2.until(&s2, 10*time.Second, "connected", connected)
	if r := e.do("DELETE", "/v1/sandboxes/"+e.id, nil, lease(e.token)); r.StatusCode != 200 {
		t.Fatalf("delete sandbox: %d %s", r.StatusCode, r.body)
	}
	e.id = ""
	c2.until(&s2, 10*time.Second, "SESSION_GONE", func(s *stream) bool { return s.hasText("error") != nil })
	if m := s2.hasText("error"); m.Code != wire.CodeSessionGone {
		t.Fatalf("error frame %+v", m)
	}
	if code := c2.closeCode(); code != websocket.StatusGoingAway {
		t.Fatalf("close %v, want 1001", code)
	}
}

// Shutdown closes attached clients with 1001; a silent client is dropped.
func testPTYShutdownAndSilentClient(t *testing.T, ts *suite) {
	// The idle timeout is 10x the ping interval, so the healthy client
	// below answers in time on a loaded machine too.
	e := ts.env(t, pty.Options{PingInterval: 200 * time.Millisecond, IdleTimeout: 2 * time.Second})
	sid := e.session(map[string]any{})

	// A client that never reads never answers pings.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	silent, _, err := websocket.Dial(ctx, e.wsURL(sid, ""), &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {e.token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer silent.CloseNow()
	testkit.Eventually(t, "the silent client to be dropped", 30*time.Second, func() bool { return !e.info(sid).Attached })
	if !e.info(sid).Running {
		t.Fatal("the session ended with its client")
	}

	c := e.dial(sid, "")
	var s stream
	c.until(&s, 10*time.Second, "connected", connected)
	done := make(chan error, 1)
	go func() { done <- e.mgr.Close() }()
	if code := c.closeCode(); code != websocket.StatusGoingAway {
		t.Fatalf("close %v, want 1001", code)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := e.do("POST", "/v1/sandboxes/"+e.id+"/pty", map[string]any{}, lease(e.token)); r.StatusCode != 503 {
		t.Fatalf("create after shutdown: %d", r.StatusCode)
	}
}
