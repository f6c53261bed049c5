package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeGateway is a hand-written attach endpoint whose every connection
// follows a script: the point is to make the drops, overlaps and refusals
// a real gateway makes only by accident.
type fakeGateway struct {
	t      *testing.T
	srv    *httptest.Server
	script []func(c *fakeConn)
	mu     sync.Mutex
	dials  []*http.Request
}

// fakeConn is one accepted connection of the script.
type fakeConn struct {
	t     *testing.T
	w     http.ResponseWriter
	r     *http.Request
	conn  *websocket.Conn
	since int64
	ctx   context.Context
}

func newFake(t *testing.T, script ...func(c *fakeConn)) *fakeGateway {
	f := &fakeGateway{t: t, script: script}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeGateway) client(t *testing.T) *Client {
	c, err := New(f.srv.URL+"/v1", "sgl1.test-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fakeGateway) serve(w http.ResponseWriter, r *http.Request) {
	if !strings.HasSuffix(r.URL.Path, "/v1/sandboxes/sbx-1/pty/pty-1/ws") {
		http.NotFound(w, r)
		return
	}
	f.mu.Lock()
	n := len(f.dials)
	f.dials = append(f.dials, r)
	f.mu.Unlock()
	if n >= len(f.script) {
		f.t.Errorf("unexpected attach #%d", n+1)
		http.Error(w, "no more", http.StatusServiceUnavailable)
		return
	}
	since, _ := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
	f.script[n](&fakeConn{t: f.t, w: w, r: r, since: since, ctx: r.Context()})
}

func (f *fakeGateway) dialed() []*http.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.dials...)
}

// accept upgrades; the connection's reads are discarded unless the script
// reads itself.
func (c *fakeConn) accept() {
	conn, err := websocket.Accept(c.w, c.r, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	c.conn = conn
}

func (c *fakeConn) send(typ websocket.MessageType, p []byte) {
	if err := c.conn.Write(c.ctx, typ, p); err != nil {
		c.t.Errorf("fake write: %v", err)
	}
}

func (c *fakeConn) replay(off int64, s string) {
	p := make([]byte, 9, 9+len(s))
	p[0] = wire.ChanReplay
	binary.BigEndian.PutUint64(p[1:], uint64(off))
	c.send(websocket.MessageBinary, append(p, s...))
}

func (c *fakeConn) output(s string) {
	c.send(websocket.MessageBinary, append([]byte{wire.ChanOutput}, s...))
}
func (c *fakeConn) text(s string) { c.send(websocket.MessageText, []byte(s)) }
func (c *fakeConn) connected()    { c.text(`{"type":"connected","session_id":"pty-1","mode":"pty"}`) }

// exit ends the session as the gateway does: exit frame, close 1000.
func (c *fakeConn) exit(code int) {
	c.text(`{"type":"exit","exit_code":` + strconv.Itoa(code) + `}`)
	c.conn.Close(websocket.StatusNormalClosure, "process exited")
}

// drop cuts the connection without a close frame.
func (c *fakeConn) drop() { c.conn.CloseNow() }

func attach(t *testing.T, c *Client, o AttachOptions) (int, string, []Event, error) {
	t.Helper()
	var out bytes.Buffer
	var events []Event
	o.Output = &out
	o.Notify = func(e Event) { events = append(events, e) }
	o.MinBackoff, o.MaxBackoff = time.Millisecond, 5*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, err := c.Attach(ctx, "sbx-1", "pty-1", o)
	return code, out.String(), events, err
}

func kinds(events []Event) []EventKind {
	var k []EventKind
	for _, e := range events {
		k = append(k, e.Kind)
	}
	return k
}

func TestReattachWritesEveryByteOnce(t *testing.T) {
	f := newFake(t,
		func(c *fakeConn) {
			if c.since != 0 {
				t.Errorf("first attach since=%d, want 0", c.since)
			}
			c.accept()
			c.replay(0, "hello ")
			c.connected()
			c.output("wor")
			c.drop()
		},
		func(c *fakeConn) {
			if c.since != 9 {
				t.Errorf("re-attach since=%d, want 9", c.since)
			}
			c.accept()
			// The replay may start before since (it overlaps what the
			// client has): only the new bytes may come out.
			c.replay(6, "world\n")
			c.connected()
			c.output("bye\n")
			c.exit(3)
		},
	)
	code, out, events, err := attach(t, f.client(t), AttachOptions{})
	if err != nil || code != 3 {
		t.Fatalf("Attach = %d, %v; want 3, nil", code, err)
	}
	if out != "hello world\nbye\n" {
		t.Errorf("output %q", out)
	}
	if got, want := kinds(events), []EventKind{Connected, Reconnecting, Connected}; !equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	for _, r := range f.dialed() {
		if r.URL.Query().Has("lease") || r.URL.Query().Has("takeover") {
			t.Errorf("dial URL %s carries a lease or takeover", r.URL)
		}
		if r.Header.Get("X-Sandbox-Lease") != "sgl1.test-token" {
			t.Errorf("dial without the lease header")
		}
	}
}

func TestReportsLostBytes(t *testing.T) {
	f := newFake(t,
		func(c *fakeConn) { c.accept(); c.replay(0, "abc"); c.connected(); c.drop() },
		func(c *fakeConn) {
			// The ring moved on past since=3: bytes 3..9 are gone.
			c.accept()
			c.replay(10, "xyz")
			c.connected()
			c.exit(0)
		},
	)
	code, out, events, err := attach(t, f.client(t), AttachOptions{})
	if err != nil || code != 0 || out != "abcxyz" {
		t.Fatalf("Attach = %d, %q, %v", code, out, err)
	}
	var lost int64
	for _, e := range events {
		if e.Kind == Lost {
			lost += e.Bytes
		}
	}
	if lost != 7 {
		t.Errorf("lost %d bytes reported, want 7 (events %+v)", lost, events)
	}
}

func TestReattachesAfterPolicyClose(t *testing.T) {
	f := newFake(t,
		func(c *fakeConn) {
			c.accept()
			c.output("x")
			c.connected()
			c.conn.Close(websocket.StatusPolicyViolation, "client too slow; re-attach with since")
		},
		func(c *fakeConn) {
			if c.since != 1 {
				t.Errorf("since=%d, want 1", c.since)
			}
			c.accept()
			c.connected()
			c.exit(0)
		},
	)
	if code, out, _, err := attach(t, f.client(t), AttachOptions{}); err != nil || code != 0 || out != "x" {
		t.Fatalf("Attach = %d, %q, %v", code, out, err)
	}
}

func TestTakenOverDoesNotRedial(t *testing.T) {
	f := newFake(t, func(c *fakeConn) {
		c.accept()
		c.connected()
		c.conn.Close(wire.CloseTakenOver, "TAKEN_OVER")
	})
	_, _, _, err := attach(t, f.client(t), AttachOptions{})
	if !errors.Is(err, ErrTakenOver) {
		t.Fatalf("Attach error %v, want ErrTakenOver", err)
	}
	if n := len(f.dialed()); n != 1 {
		t.Errorf("%d dials, want 1", n)
	}
}

func alreadyConnected(c *fakeConn) {
	c.w.Header().Set("Content-Type", "application/problem+json")
	c.w.WriteHeader(http.StatusConflict)
	json.NewEncoder(c.w).Encode(api.Problem{Status: 409, Code: "ALREADY_CONNECTED", Detail: "another client is attached"})
}

func TestAlreadyConnected(t *testing.T) {
	f := newFake(t, alreadyConnected)
	_, _, _, err := attach(t, f.client(t), AttachOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict || e.Code != "ALREADY_CONNECTED" {
		t.Fatalf("Attach error %#v, want a 409 ALREADY_CONNECTED *Error", err)
	}

	// With Takeover the first dial asks for it; re-dials do not.
	f = newFake(t,
		func(c *fakeConn) { c.accept(); c.connected(); c.drop() },
		func(c *fakeConn) { c.accept(); c.connected(); c.exit(0) },
	)
	if _, _, _, err := attach(t, f.client(t), AttachOptions{Takeover: true}); err != nil {
		t.Fatal(err)
	}
	d := f.dialed()
	if d[0].URL.Query().Get("takeover") != "1" || d[1].URL.Query().Has("takeover") {
		t.Errorf("takeover on dials: %q, %q", d[0].URL.RawQuery, d[1].URL.RawQuery)
	}
}

// After a drop the gateway may still count the dead connection as the
// holder for a moment: a 409 then is retried.
func TestBusyAfterDropIsRetried(t *testing.T) {
	f := newFake(t,
		func(c *fakeConn) { c.accept(); c.connected(); c.drop() },
		alreadyConnected,
		alreadyConnected,
		func(c *fakeConn) { c.accept(); c.connected(); c.exit(5) },
	)
	if code, _, _, err := attach(t, f.client(t), AttachOptions{}); err != nil || code != 5 {
		t.Fatalf("Attach = %d, %v; want 5", code, err)
	}
}

func TestInputAndResize(t *testing.T) {
	type msg struct {
		typ  websocket.MessageType
		data string
	}
	got := make(chan msg, 16)
	in := make(chan []byte)
	resize := make(chan Size)
	release := make(chan struct{})
	f := newFake(t, func(c *fakeConn) {
		c.accept()
		c.connected()
		for {
			typ, data, err := c.conn.Read(c.ctx)
			if err != nil {
				return
			}
			got <- msg{typ, string(data)}
			if string(data) == "\x00exit\r" {
				<-release
				c.exit(0)
			}
		}
	})
	cl := f.client(t)
	done := make(chan error, 1)
	go func() {
		_, _, _, err := attach(t, cl, AttachOptions{
			Input:  in,
			Resize: resize,
			Size:   func() (Size, bool) { return Size{Rows: 24, Cols: 80}, true },
		})
		done <- err
	}()
	want := func(typ websocket.MessageType, data string) {
		t.Helper()
		select {
		case m := <-got:
			if m.typ != typ || m.data != data {
				t.Fatalf("server got %v %q, want %v %q", m.typ, m.data, typ, data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("server did not get %q", data)
		}
	}
	want(websocket.MessageText, `{"cols":80,"rows":24,"type":"resize"}`)
	resize <- Size{Rows: 40, Cols: 100}
	want(websocket.MessageText, `{"cols":100,"rows":40,"type":"resize"}`)
	in <- []byte("exit\r")
	want(websocket.MessageBinary, "\x00exit\r")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Ctrl-C typed while the gateway is unreachable gives up.
func TestInterruptWhileReconnecting(t *testing.T) {
	f := newFake(t, func(c *fakeConn) { c.accept(); c.connected(); c.drop() })
	cl := f.client(t)
	f.srv.Close() // no gateway any more: every re-dial fails
	in := make(chan []byte, 1)
	in <- []byte{0x03}
	_, _, _, err := attach(t, cl, AttachOptions{Input: in})
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Attach error %v, want ErrInterrupted", err)
	}
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "localhost:8080", "ftp://x", "http://"} {
		if _, err := New(u, "t", nil); err == nil {
			t.Errorf("New(%q) accepted", u)
		}
	}
	c, err := New("https://gw.example/v1/", "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.wsURL("sbx-1", "pty-1", 7, true); got != "wss://gw.example/v1/sandboxes/sbx-1/pty/pty-1/ws?since=7&takeover=1" {
		t.Errorf("wsURL = %s", got)
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A first attach cut during its handshake may have been taken by the
// gateway, which then holds it for a moment: the 409 that meets the retry
// is our own ghost and is retried too. A first attach refused outright
// (TestAlreadyConnected) is not.
func TestBusyAfterCutHandshakeIsRetried(t *testing.T) {
	f := newFake(t,
		func(c *fakeConn) { c.accept(); c.drop() }, // upgraded, cut before "connected"
		alreadyConnected,
		alreadyConnected,
		func(c *fakeConn) { c.accept(); c.connected(); c.output("hi"); c.exit(3) },
	)
	code, out, _, err := attach(t, f.client(t), AttachOptions{})
	if err != nil || code != 3 || out != "hi" {
		t.Fatalf("Attach = %d, %q, %v; want 3, \"hi\"", code, out, err)
	}
	if n := len(f.dialed()); n != 4 {
		t.Errorf("%d dials, want 4", n)
	}

	// A holder that stays is still reported, after a few tries.
	script := []func(*fakeConn){func(c *fakeConn) { c.accept(); c.drop() }}
	for range busyRetries + 1 {
		script = append(script, alreadyConnected)
	}
	f = newFake(t, script...)
	_, _, _, err = attach(t, f.client(t), AttachOptions{})
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusConflict {
		t.Fatalf("Attach error %#v, want a 409 *Error", err)
	}
	if n := len(f.dialed()); n != busyRetries+2 {
		t.Errorf("%d dials, want %d", n, busyRetries+2)
	}
}

// TestMessagesOfEverySize: the attachment reads every message into one
// buffer it reuses; a message after a larger one (a replay over the
// buffer it keeps, then live output) or a smaller one comes out whole,
// and nothing of an earlier message leaks into a later one.
func TestMessagesOfEverySize(t *testing.T) {
	replay := strings.Repeat("r", keepBuf+100)
	big := strings.Repeat("b", 300<<10)
	f := newFake(t, func(c *fakeConn) {
		c.accept()
		c.replay(0, replay)
		c.connected()
		c.output("x")
		c.output(big)
		c.output("yz")
		c.output("")
		c.output("end\n")
		c.exit(0)
	})
	code, out, _, err := attach(t, f.client(t), AttachOptions{})
	if err != nil || code != 0 {
		t.Fatalf("Attach = %d, %v; want 0, nil", code, err)
	}
	if want := replay + "x" + big + "yzend\n"; out != want {
		t.Fatalf("output of %d bytes differs from the %d sent", len(out), len(want))
	}
}
