package handlers

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local"
	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/wire"
)

// The terminal-session benchmarks (SPEC §11), on the real stack in this
// process: local provider, service, handlers, loopback HTTP and WebSocket.
// Run with `make bench` (see the README's Performance section).

type benchEnv struct {
	b     *testing.B
	srv   *httptest.Server
	p     *local.Local
	id    string
	token string
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("the local provider's namespaces need root")
	}
	p, err := local.New(local.Options{StateDir: b.TempDir(), Logger: discard()})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := sandbox.New(context.Background(), sandbox.Options{Provider: p, StateDir: b.TempDir(), AllowAnonymous: true})
	if err != nil {
		b.Fatal(err)
	}
	mgr := pty.NewManager(svc, pty.Options{MaxPerSandbox: 2000}) // the idle benchmark holds 1,000 in one sandbox
	h, err := New(Options{Service: svc, PTY: mgr})
	if err != nil {
		b.Fatal(err)
	}
	e := &benchEnv{b: b, srv: httptest.NewServer(h), p: p}
	b.Cleanup(func() {
		mgr.Close()
		if e.id != "" {
			e.call("DELETE", "/v1/sandboxes/"+e.id, "", nil)
		}
		e.srv.Close()
		svc.Close()
		p.Close()
	})
	var ref struct {
		SandboxID string `json:"sandbox_id"`
		Token     string `json:"lease_token"`
	}
	e.call("POST", "/v1/sandboxes", "{}", &ref)
	e.id, e.token = ref.SandboxID, ref.Token
	return e
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func (e *benchEnv) call(method, path, body string, out any) {
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sandbox-Lease", e.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.b.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		e.b.Fatalf("%s %s: %d %s", method, path, res.StatusCode, data)
	}
	if out != nil {
		json.Unmarshal(data, out)
	}
}

func (e *benchEnv) session(command string, tty bool) string {
	body, _ := json.Marshal(map[string]any{"command": command, "pty": tty})
	var out struct {
		SessionID string `json:"session_id"`
	}
	e.call("POST", "/v1/sandboxes/"+e.id+"/pty", string(body), &out)
	return out.SessionID
}

func (e *benchEnv) dial(ctx context.Context, sid string) *websocket.Conn {
	u := "ws" + strings.TrimPrefix(e.srv.URL, "http") + "/v1/sandboxes/" + e.id + "/pty/" + sid + "/ws"
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"X-Sandbox-Lease": {e.token}}})
	if err != nil {
		e.b.Fatal(err)
	}
	conn.SetReadLimit(-1)
	return conn
}

// BenchmarkPTYOutput moves `head -c N MiB /dev/zero | base64` (N = b.N)
// through a session's WebSocket on loopback, and through a session of the
// sandbox's agent attached straight to it (the ceiling).
// Metrics: ws-MB/s, direct-MB/s and their ratio.
func BenchmarkPTYOutput(b *testing.B) {
	for _, mode := range []string{"pty", "pipe"} {
		b.Run(mode, func(b *testing.B) {
			e := newBenchEnv(b)
			tty := mode == "pty"
			// The process waits for a line so that nothing is produced
			// before the client is there to take it.
			// Two interleaved rounds of each, half of b.N MiB per run.
			cmd := fmt.Sprintf("read go; head -c %d /dev/zero | base64", max(b.N/2, 1)<<20)
			var wsBytes, directBytes int64
			var wsTime, directTime time.Duration
			b.ResetTimer()
			for range 2 {
				n, d := e.direct(cmd, tty)
				directBytes, directTime = directBytes+n, directTime+d
				n, d = e.viaWebSocket(cmd, tty)
				wsBytes, wsTime = wsBytes+n, wsTime+d
			}
			b.StopTimer()
			ws := float64(wsBytes) / wsTime.Seconds() / 1e6
			direct := float64(directBytes) / directTime.Seconds() / 1e6
			b.ReportMetric(ws, "ws-MB/s")
			b.ReportMetric(direct, "direct-MB/s")
			b.ReportMetric(ws/direct, "ratio")
		})
	}
}

// viaWebSocket returns the output bytes received and the time from the
// go line to the exit frame.
func (e *benchEnv) viaWebSocket(cmd string, tty bool) (int64, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sid := e.session(cmd, tty)
	conn := e.dial(ctx, sid)
	defer conn.CloseNow()
	var (
		n     int64
		start time.Time
		buf   = make([]byte, 64<<10)
	)
	for {
		typ, r, err := conn.Reader(ctx)
		if err != nil {
			e.b.Fatalf("read: %v", err)
		}
		if typ == websocket.MessageText {
			msg, _ := io.ReadAll(r)
			switch {
			case bytes.Contains(msg, []byte(`"connected"`)):
				start = time.Now()
				if err := conn.Write(ctx, websocket.MessageBinary, []byte("\x00\n")); err != nil {
					e.b.Fatal(err)
				}
			case bytes.Contains(msg, []byte(`"exit"`)):
				return n, time.Since(start)
			}
			continue
		}
		for {
			k, err := r.Read(buf)
			n += int64(k)
			if err != nil {
				break
			}
		}
		n-- // the channel byte
	}
}

// direct starts the same command as a session of the sandbox's agent,
// attached straight to it (no gateway, no WebSocket), and reads it to its
// exit.
func (e *benchEnv) direct(cmd string, tty bool) (int64, time.Duration) {
	a, end := e.directSession(context.Background(), cmd, tty)
	defer end()
	start := time.Now()
	if err := a.Input([]byte("\n")); err != nil {
		e.b.Fatal(err)
	}
	n := int64(len(a.Replay))
	for {
		ev, err := a.Next()
		if err != nil {
			e.b.Fatalf("direct: %v", err)
		}
		if ev.Exited {
			if ev.Code != 0 || ev.Lost {
				e.b.Fatalf("direct: exit %d (lost %v)", ev.Code, ev.Lost)
			}
			return n, time.Since(start)
		}
		n += int64(len(ev.Data))
	}
}

// directSession starts cmd as a session of the sandbox's agent and
// attaches to it; end deletes the session.
func (e *benchEnv) directSession(ctx context.Context, cmd string, tty bool) (*agentclient.Attachment, func()) {
	c, err := e.p.Agent(ctx, e.id)
	if err != nil {
		e.b.Fatal(err)
	}
	sid := "direct-" + rand.Text()[:12]
	if _, err := c.StartSession(ctx, sid, providers.ProcessSpec{Command: cmd, TTY: tty}, false, agentwire.DefaultRing); err != nil {
		e.b.Fatal(err)
	}
	a, err := c.Attach(ctx, sid, 0, nil, agentwire.DefaultRing)
	if err != nil {
		c.DeleteSession(ctx, sid)
		e.b.Fatal(err)
	}
	return a, func() {
		c.DeleteSession(context.WithoutCancel(ctx), sid)
		a.Close()
	}
}

// BenchmarkPTYKeystrokeEcho times one byte typed into a raw-mode cat and
// echoed back, through the WebSocket (the session held by the sandbox's
// init), alternating with the same echo through a session attached
// straight to the sandbox's agent (no gateway: the floor). p50 and p99.
func BenchmarkPTYKeystrokeEcho(b *testing.B) {
	e := newBenchEnv(b)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const cat = "stty raw -echo; echo READY; exec cat"
	sid := e.session(cat, true)
	conn := e.dial(ctx, sid)
	defer conn.CloseNow()
	var out []byte
	for !bytes.Contains(out, []byte("READY")) {
		typ, m, err := conn.Read(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if typ == websocket.MessageBinary {
			out = append(out, m[1:]...)
			if m[0] == wire.ChanReplay {
				out = append(out[:0], m[9:]...)
			}
		}
	}
	direct, end := e.directSession(ctx, cat, true)
	defer end()
	for seen := string(direct.Replay); !strings.Contains(seen, "READY"); {
		ev, err := direct.Next()
		if err != nil || ev.Exited {
			b.Fatalf("direct: %v (exited %v)", err, ev.Exited)
		}
		seen += string(ev.Data)
	}
	lat := make([]time.Duration, 0, b.N)
	floor := make([]time.Duration, 0, b.N)
	key := []byte{0, 'k'}
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := conn.Write(ctx, websocket.MessageBinary, key); err != nil {
			b.Fatal(err)
		}
		for got := false; !got; {
			typ, m, err := conn.Read(ctx)
			if err != nil {
				b.Fatal(err)
			}
			got = typ == websocket.MessageBinary && bytes.IndexByte(m[1:], 'k') >= 0
		}
		lat = append(lat, time.Since(start))
		start = time.Now()
		if err := direct.Input(key[1:]); err != nil {
			b.Fatal(err)
		}
		if ev, err := direct.Next(); err != nil || ev.Exited {
			b.Fatalf("direct: %v (exited %v)", err, ev.Exited)
		}
		floor = append(floor, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(floor)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(floor[len(floor)/2].Microseconds()), "pty-p50-µs")
}

// BenchmarkPTYIdleSessionsHeap measures the gateway's heap with 1,000 idle
// PTY sessions (each a cat waiting on its terminal); b.N is ignored.
func BenchmarkPTYIdleSessionsHeap(b *testing.B) {
	e := newBenchEnv(b)
	const n = 1000
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			e.session("cat", true)
		}()
	}
	wg.Wait()
	after := heap()
	var list struct {
		Sessions []json.RawMessage `json:"sessions"`
	}
	e.call("GET", "/v1/sandboxes/"+e.id+"/pty", "", &list)
	if len(list.Sessions) != n {
		b.Fatalf("%d sessions, want %d", len(list.Sessions), n)
	}
	grew := float64(int64(after) - int64(before)) // the sessions live in the sandbox: about 0, either sign
	b.ReportMetric(grew/(1<<20), "heap-MiB")
	b.ReportMetric(grew/n/1024, "KiB/session")
}
