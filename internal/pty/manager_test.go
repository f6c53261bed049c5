package pty

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
	"github.com/sandgate/sandgate/internal/wire"
)

// The manager alone, no sandbox: its one sandbox ("sb") is an in-process
// agent server on one end of a pipe, the manager's session host the
// client on the other, and the routes an httptest server calling Attach.

// hostSvc is the Service of one sandbox whose sessions live in an
// in-process agent; it lets every caller in.
type hostSvc struct {
	host *agentclient.Client

	mu       sync.Mutex
	onRemove []func(string)
}

func (s *hostSvc) SessionHost(context.Context, sandbox.Caller, string) (*agentclient.Client, error) {
	return s.host, nil
}

func (s *hostSvc) ProcessSpec(_ context.Context, _ sandbox.Caller, _ string, spec providers.ProcessSpec) (providers.ProcessSpec, error) {
	return spec, nil
}
func (s *hostSvc) Access(context.Context, sandbox.Caller, string) error { return nil }
func (s *hostSvc) Hold(string) func()                                   { return func() {} }
func (s *hostSvc) Touch(string)                                         {}
func (s *hostSvc) OnRemove(f func(string)) {
	s.mu.Lock()
	s.onRemove = append(s.onRemove, f)
	s.mu.Unlock()
}

type ptyEnv struct {
	t   *testing.T
	m   *Manager
	srv *httptest.Server
}

// newEnv starts an agent server and a manager of options o over it.
func newEnv(t *testing.T, o Options) *ptyEnv {
	t.Helper()
	return newEnvWith(t, o, nil)
}

// newEnvWith is newEnv with the routes' listener wrapped by wrap (nil:
// as it is).
func newEnvWith(t *testing.T, o Options, wrap func(net.Listener) net.Listener) *ptyEnv {
	t.Helper()
	srv := agent.NewServer(false)
	a, b := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(a, nil)
	}()
	host, err := agentclient.Dial(testkit.Context(t, time.Minute), b)
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(&hostSvc{host: host}, o)
	hs := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		since, _ := strconv.ParseInt(q.Get("since"), 10, 64)
		err := m.Attach(w, r, sandbox.Caller{}, AttachRequest{SandboxID: "sb", SessionID: q.Get("session"), Since: since, Takeover: q.Get("takeover") == "1"})
		if err != nil {
			// What handlers render, reduced to what the tests look at.
			status := http.StatusInternalServerError
			if errors.Is(err, providers.ErrConflict) {
				status = http.StatusConflict
			} else if providers.Kind(err) == providers.ErrNotFound {
				status = http.StatusNotFound
			}
			http.Error(w, err.Error(), status)
		}
	}))
	if wrap != nil {
		hs.Listener = wrap(hs.Listener)
	}
	hs.Start()
	t.Cleanup(func() {
		m.Close()
		hs.Close()
		host.Close()
		<-served
		srv.Close()
	})
	return &ptyEnv{t: t, m: m, srv: hs}
}

// session starts command in a terminal now.
func (e *ptyEnv) session(command string) string {
	e.t.Helper()
	info, err := e.m.Create(testkit.Context(e.t, time.Minute), sandbox.Caller{}, "sb", providers.ProcessSpec{Command: command, TTY: true, Rows: 24, Cols: 80}, StartNow)
	if err != nil {
		e.t.Fatal(err)
	}
	return info.ID
}

// conn is one attached client and everything it received.
type conn struct {
	t  *testing.T
	ws *websocket.Conn

	mu       sync.Mutex
	out      bytes.Buffer // replay and output bytes, in order
	from     int64        // the replay's offset; -1 before one came
	texts    []wire.ServerMsg
	err      error // why reading ended
	readDone chan struct{}
}

func (e *ptyEnv) dial(sid, query string) (*conn, *http.Response, error) {
	u := "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/?session=" + sid
	if query != "" {
		u += "&" + query
	}
	ws, res, err := websocket.Dial(testkit.Context(e.t, time.Minute), u, nil)
	if err != nil {
		return nil, res, err
	}
	ws.SetReadLimit(-1)
	c := &conn{t: e.t, ws: ws, from: -1, readDone: make(chan struct{})}
	go c.read()
	e.t.Cleanup(func() {
		ws.CloseNow()
		<-c.readDone
	})
	return c, res, nil
}

func (e *ptyEnv) attach(sid, query string) *conn {
	e.t.Helper()
	c, _, err := e.dial(sid, query)
	if err != nil {
		e.t.Fatalf("attach %s: %v", sid, err)
	}
	return c
}

func (c *conn) read() {
	defer close(c.readDone)
	for {
		typ, b, err := c.ws.Read(context.Background())
		c.mu.Lock()
		if err != nil {
			c.err = err
			c.mu.Unlock()
			return
		}
		if typ == websocket.MessageText {
			var m wire.ServerMsg
			json.Unmarshal(b, &m)
			c.texts = append(c.texts, m)
		} else if f, err := wire.DecodeServer(b); err == nil {
			if f.Channel == wire.ChanReplay && c.from < 0 {
				c.from = f.Offset
			}
			c.out.Write(f.Data)
		}
		c.mu.Unlock()
	}
}

func (c *conn) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

func (c *conn) waitOutput(want string) {
	c.t.Helper()
	testkit.Eventually(c.t, "output "+strconv.Quote(want), 30*time.Second, func() bool { return strings.Contains(c.output(), want) })
}

func (c *conn) stdin(s string) {
	c.t.Helper()
	if err := c.ws.Write(testkit.Context(c.t, time.Minute), websocket.MessageBinary, append([]byte{wire.ChanStdin}, s...)); err != nil {
		c.t.Fatal(err)
	}
}

// closeStatus waits for the connection to end and returns its close code.
func (c *conn) closeStatus() websocket.StatusCode {
	c.t.Helper()
	select {
	case <-c.readDone:
	case <-time.After(time.Minute):
		c.t.Fatal("the connection was not closed")
	}
	return websocket.CloseStatus(c.err)
}

// A client attaches, types, and reads the terminal's echo; the session
// lives on after it leaves.
func TestAttachEcho(t *testing.T) {
	e := newEnv(t, Options{})
	sid := e.session("cat")
	c := e.attach(sid, "")
	c.stdin("hel" + "lo\n")
	c.waitOutput("hello")
	c.ws.Close(websocket.StatusNormalClosure, "")
	e.waitDetached(sid)
}

// waitDetached waits until session sid is running with no client: the
// server ends an attachment after the client's close handshake, so a
// client that attaches again at once could still find it held (409).
func (e *ptyEnv) waitDetached(sid string) {
	e.t.Helper()
	testkit.Eventually(e.t, "the client to be detached", 30*time.Second, func() bool {
		info, err := e.m.Get(e.t.Context(), sandbox.Caller{}, "sb", sid)
		return err == nil && info.Running && !info.Attached
	})
}

// A second attach is refused with 409 while one holds the session; with
// takeover the holder is closed with 4001 and the newcomer gets the
// replay of everything so far.
func TestTakeover(t *testing.T) {
	e := newEnv(t, Options{})
	sid := e.session("cat")
	a := e.attach(sid, "")
	a.stdin("first\n")
	a.waitOutput("first")

	if _, res, err := e.dial(sid, ""); err == nil || res == nil || res.StatusCode != http.StatusConflict {
		t.Fatalf("second attach without takeover: %v, %v", err, res)
	}
	b := e.attach(sid, "takeover=1")
	if code := a.closeStatus(); code != wire.CloseTakenOver {
		t.Fatalf("evicted holder closed with %v (%v), want 4001", code, a.err)
	}
	b.waitOutput("first")
	b.stdin("second\n")
	b.waitOutput("second")
}

// A re-attach with since replays from there; an offset older than the
// ring replays from the ring's start.
func TestReplaySince(t *testing.T) {
	const ring = 4 << 10
	e := newEnv(t, Options{RingBytes: ring})
	sid := e.session("cat")
	a := e.attach(sid, "")
	a.stdin("one\n")
	a.waitOutput("one\r\none\r\n") // the echo and cat's copy
	mark := int64(len(a.output()))
	a.stdin("two\n")
	a.waitOutput("two\r\ntwo\r\n")
	a.ws.Close(websocket.StatusNormalClosure, "")
	a.closeStatus()
	e.waitDetached(sid)

	b := e.attach(sid, "since="+strconv.FormatInt(mark, 10))
	b.waitOutput("two\r\ntwo\r\n")
	if got := b.output(); strings.Contains(got, "one") || b.from != mark {
		t.Fatalf("replay since %d: from %d, %q", mark, b.from, got)
	}
	// More than a ring of output (lines short of the tty's line limit),
	// a line at a time: the tty's input queue (4 KiB) drops what a slow cat
	// has not read yet.
	line := strings.Repeat("x", 1000) + "\r\n"
	for i := range 4 {
		b.stdin(line[:1000] + "\n")
		testkit.Eventually(t, "the line's echo and copy", 30*time.Second, func() bool { return strings.Count(b.output(), line) == 2*(i+1) })
	}
	b.stdin("en" + "d\n")
	// The echo of the input and cat's copies interleave: wait for both
	// copies of the last line.
	testkit.Eventually(t, "both ends", 30*time.Second, func() bool { return strings.Count(b.output(), "end\r\n") == 2 })
	b.mu.Lock()
	end := b.from + int64(b.out.Len())
	b.mu.Unlock()
	if end-mark < ring {
		t.Fatalf("only %d bytes written past the mark, want over a ring (%d)", end-mark, ring)
	}
	b.ws.Close(websocket.StatusNormalClosure, "")
	b.closeStatus()
	e.waitDetached(sid)

	c := e.attach(sid, "since=0")
	testkit.Eventually(t, "the replay", 30*time.Second, func() bool { return strings.Count(c.output(), "end\r\n") == 2 })
	c.mu.Lock()
	from, n := c.from, c.out.Len()
	c.mu.Unlock()
	if from <= 0 || n > ring || from+int64(n) != end {
		t.Fatalf("replay since 0 past the ring: from %d, %d bytes; want a start past 0, at most %d bytes, up to %d", from, n, ring, end)
	}
}

// MaxPerSandbox sessions and no more (ErrTooMany); a delete frees a slot.
func TestSessionLimit(t *testing.T) {
	e := newEnv(t, Options{MaxPerSandbox: 2})
	first := e.session("cat")
	e.session("cat")
	ctx := testkit.Context(t, time.Minute)
	if _, err := e.m.Create(ctx, sandbox.Caller{}, "sb", providers.ProcessSpec{Command: "cat", TTY: true}, StartNow); providers.Kind(err) != providers.ErrTooMany {
		t.Fatalf("a third session: %v, want ErrTooMany", err)
	}
	if err := e.m.Delete(ctx, sandbox.Caller{}, "sb", first); err != nil {
		t.Fatal(err)
	}
	e.session("cat")
}

// A client's queue buffers grow to what a stream needs and are reused
// while it streams; once its writer has waited releaseAfter for output,
// buffers over keepSpare are let go.
func TestQueueBuffersKeptWhileStreaming(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release time.Duration
	}{{"kept", time.Hour}, {"released", 10 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			e.m.releaseAfter = tc.release
			const size = 16 << 20
			sid := e.session(fmt.Sprintf("stty raw -echo; read go; head -c %d /dev/zero | tr '\\0' x; exec cat", size))
			ctx := testkit.Context(t, time.Minute)
			ws := e.dialSmall(ctx, sid)
			if err := ws.Write(ctx, websocket.MessageBinary, []byte{wire.ChanStdin, '\n'}); err != nil {
				t.Fatal(err)
			}
			// Nothing is read until the queue holds more than keepSpare.
			testkit.Eventually(t, "a queue over keepSpare", 30*time.Second, func() bool { return e.queueCap() > keepSpare })
			for got := 0; got < size; {
				typ, b, err := ws.Read(ctx)
				if err != nil {
					t.Fatalf("after %d bytes: %v", got, err)
				}
				if typ == websocket.MessageBinary && b[0] == wire.ChanOutput {
					got += bytes.Count(b[1:], []byte("x"))
				}
			}
			if tc.release == time.Hour {
				if n := e.queueCap(); n <= keepSpare {
					t.Fatalf("after the stream the client holds %d bytes of buffers, want the stream's (over %d)", n, keepSpare)
				}
				return
			}
			testkit.Eventually(t, "the buffers let go", 30*time.Second, func() bool { return e.queueCap() <= keepSpare })
		})
	}
}

// dialSmall attaches to session sid over a connection with a small
// receive buffer, so that it holds little of what the client does not read
// and the client's queue fills.
func (e *ptyEnv) dialSmall(ctx context.Context, sid string) *websocket.Conn {
	e.t.Helper()
	small := &net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 16<<10) })
	}}
	hc := &http.Client{Transport: &http.Transport{DialContext: small.DialContext}}
	e.t.Cleanup(hc.CloseIdleConnections)
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(e.srv.URL, "http")+"/?session="+sid, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { ws.CloseNow() })
	ws.SetReadLimit(-1)
	return ws
}

// smallSendBuffers gives every connection ln accepts a small send buffer,
// so that the kernel holds little of what the gateway writes.
func smallSendBuffers(ln net.Listener) net.Listener { return smallSendListener{ln} }

type smallSendListener struct{ net.Listener }

func (l smallSendListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		err = tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

// A client reading slowly but steadily is slow, not stuck: it is kept, and
// the process paced to it, even when a queue's worth of its frames takes
// longer than stallAfter to write. (One that takes nothing for stallAfter
// is closed with 1008: the terminal suite's testPTYSlowClientDropped.)
func TestSteadySlowClientKept(t *testing.T) {
	const queue, size, rate = 2 << 20, 5 << 20, 1 << 20 // bytes, bytes, bytes/s
	e := newEnvWith(t, Options{QueueBytes: queue}, smallSendBuffers)
	e.m.stallAfter = time.Second
	sid := e.session(fmt.Sprintf("stty raw -echo; read go; head -c %d /dev/zero | tr '\\0' x; exec cat", size))
	ctx := testkit.Context(t, time.Minute)
	ws := e.dialSmall(ctx, sid)
	if err := ws.Write(ctx, websocket.MessageBinary, []byte{wire.ChanStdin, '\n'}); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing until its queue is nearly full; then it
	// reads at rate: a frame (at most 256 KiB) comes every 250 ms or less,
	// far within stallAfter, a queue's worth takes 2 s, beyond it, while
	// the session has output ready to fill the queue again in well under
	// a second.
	testkit.Eventually(t, "a full queue", 30*time.Second, func() bool { return e.queueLen() >= queue-(256<<10) })
	buf := make([]byte, 8<<10)
	start := time.Now()
	for got := 0; got < size; {
		typ, r, err := ws.Reader(ctx)
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", got, size, err)
		}
		for {
			n, err := r.Read(buf)
			if typ == websocket.MessageBinary {
				got += bytes.Count(buf[:n], []byte("x"))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d of %d bytes: %v", got, size, err)
			}
			if ahead := time.Duration(got)*time.Second/rate - time.Since(start); ahead > 0 {
				time.Sleep(ahead) // the slow client's pace
			}
		}
	}
}

// queueLen is how much output the one attached client has queued, with
// what its writer took and has not written yet.
func (e *ptyEnv) queueLen() (n int) {
	e.eachClient(func(cl *client) { n += len(cl.q.buf) + cl.held })
	return n
}

// queueCap is the capacity of the one attached client's queue buffers,
// the larger of the two.
func (e *ptyEnv) queueCap() (n int) {
	e.eachClient(func(cl *client) { n = max(n, cap(cl.q.buf), cap(cl.spare.buf)) })
	return n
}

// eachClient calls f with each attached client, locked.
func (e *ptyEnv) eachClient(f func(cl *client)) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	for cl := range e.m.clients {
		cl.mu.Lock()
		f(cl)
		cl.mu.Unlock()
	}
}
