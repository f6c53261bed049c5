package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/hashicorp/yamux"

	"github.com/sandgate/sandgate/internal/providers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair serves a fresh server on one end of a pipe and dials the other.
// The server is the test process's subreaper, as the agent is the
// sandbox's.
func pair(t testing.TB) (*Server, *Client) {
	t.Helper()
	srv := NewServer(true)
	_, b, served := servePipe(srv)
	c, err := Dial(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		<-served
		srv.Close()
	})
	return srv, c
}

// servePipe serves srv on one end of a pipe (a) and returns the other
// (b); served closes when Serve returns.
func servePipe(srv *Server) (a, b net.Conn, served <-chan struct{}) {
	a, b = net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(a, nil)
	}()
	return a, b, done
}

func run(t *testing.T, c *Client, req providers.ExecRequest) providers.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = 30 * time.Second
	}
	res, err := c.Exec(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestExec(t *testing.T) {
	_, c := pair(t)
	res := run(t, c, providers.ExecRequest{Command: "echo out; echo err >&2; read x; echo got $x; exit 3", Stdin: []byte("in\n")})
	if string(res.Stdout) != "out\ngot in\n" || string(res.Stderr) != "err\n" || res.ExitCode != 3 {
		t.Fatalf("got %q %q %d", res.Stdout, res.Stderr, res.ExitCode)
	}
	if res.Usage == nil || res.Duration <= 0 {
		t.Fatalf("no accounting: %+v", res)
	}
	res = run(t, c, providers.ExecRequest{Command: "head -c 100000 /dev/zero", MaxOutput: 1000})
	if len(res.Stdout) != 1000 || !res.Truncated {
		t.Fatalf("cap: %d bytes, truncated %v", len(res.Stdout), res.Truncated)
	}
	res = run(t, c, providers.ExecRequest{Command: "kill -TERM $$"})
	if res.ExitCode != 128+15 {
		t.Fatalf("signalled: exit %d", res.ExitCode)
	}
	_, err := c.Exec(context.Background(), providers.ExecRequest{Command: "true", Cwd: "/nonexistent/dir", Timeout: time.Second})
	if !errors.Is(err, providers.ErrInvalid) {
		t.Fatalf("missing cwd: %v", err)
	}
	_, err = c.Exec(context.Background(), providers.ExecRequest{Command: "true", User: "no-such-user-here", Timeout: time.Second})
	if !errors.Is(err, providers.ErrInvalid) {
		t.Fatalf("unknown user: %v", err)
	}
}

// gone waits until pid has exited (or is a zombie).
func gone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !zombie(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func leftover(t *testing.T, res providers.ExecResult) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		t.Fatalf("no pid in %q (stderr %q)", res.Stdout, res.Stderr)
	}
	return pid
}

func TestExecKillsLeftovers(t *testing.T) {
	_, c := pair(t)
	// A setsid leftover leaves the command's session and group.
	res := run(t, c, providers.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 & echo $!"})
	gone(t, leftover(t, res))

	// Preserved, it runs on.
	res = run(t, c, providers.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 & echo $!", PreserveBackground: true})
	pid := leftover(t, res)
	time.Sleep(50 * time.Millisecond)
	if zombie(pid) {
		t.Fatal("a preserved background process was killed")
	}
	syscall.Kill(pid, syscall.SIGKILL)

	// A timeout kills the tree, setsid leftovers too, and says so.
	dir := t.TempDir()
	res = run(t, c, providers.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 & echo $! > " + dir + "/pid; sleep 300", Timeout: 300 * time.Millisecond})
	if !res.TimedOut || res.ExitCode != 125 {
		t.Fatalf("timeout: %+v", res)
	}
	b, _ := os.ReadFile(dir + "/pid")
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	gone(t, pid)

	// A cancelled context too.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if _, err := os.Stat(dir + "/pid2"); err == nil {
				cancel()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_, err := c.Exec(ctx, providers.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 & echo $! > " + dir + "/pid2.tmp; mv " + dir + "/pid2.tmp " + dir + "/pid2; sleep 300", Timeout: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}
	b, _ = os.ReadFile(dir + "/pid2")
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	gone(t, pid)
}

func TestFiles(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "a", "b", "f")
	data := bytes.Repeat([]byte("0123456789"), 300_000)
	n, err := c.WriteFile(ctx, p, bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: %d %v", n, err)
	}
	r, size, err := c.ReadFile(ctx, p)
	if err != nil || size != int64(len(data)) {
		t.Fatalf("read: %d %v", size, err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v", len(got), err)
	}
	if _, _, err := c.ReadFile(ctx, p+".missing"); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("missing: %v", err)
	}
	if _, _, err := c.ReadFile(ctx, filepath.Dir(p)); !errors.Is(err, providers.ErrInvalid) {
		t.Fatalf("directory: %v", err)
	}
	if _, err := c.WriteFile(ctx, filepath.Dir(p), strings.NewReader("x")); !errors.Is(err, providers.ErrInvalid) {
		t.Fatalf("write over a directory: %v", err)
	}
	if _, err := c.WriteFile(ctx, "relative", strings.NewReader("x")); !errors.Is(err, providers.ErrInvalid) {
		t.Fatalf("relative: %v", err)
	}
}

// collect reads an attachment's events until want is seen in the output
// or the exit, and returns the output.
func collect(t *testing.T, a *Attachment, want string) (string, *Event) {
	t.Helper()
	var out bytes.Buffer
	for !strings.Contains(out.String(), want) {
		ev, err := a.Next()
		if err != nil {
			t.Fatalf("next: %v (so far %q)", err, out.String())
		}
		if ev.Exited {
			return out.String(), &ev
		}
		out.Write(ev.Data)
	}
	return out.String(), nil
}

// pairDirect is pair over a unix socket, with attachments on connections
// of their own (WithDirect).
func pairDirect(t testing.TB) (*Server, *Client) {
	t.Helper()
	srv := NewServer(true)
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				srv.Serve(c, nil)
			}()
		}
	}()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}
	conn, err := dial(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), conn, WithDirect(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		l.Close()
		<-served
	})
	return srv, c
}

func TestSessionReplay(t *testing.T) {
	t.Run("mux", func(t *testing.T) {
		_, c := pair(t)
		sessionReplay(t, c)
	})
	t.Run("direct", func(t *testing.T) {
		_, c := pairDirect(t)
		sessionReplay(t, c)
	})
}

func sessionReplay(t *testing.T, c *Client) {
	ctx := context.Background()
	info, err := c.StartSession(ctx, "s1", providers.ProcessSpec{Command: "cat", TTY: true, Rows: 30, Cols: 100}, false, 0)
	if err != nil || !info.Running || !info.TTY {
		t.Fatalf("start: %+v %v", info, err)
	}
	a, err := c.Attach(ctx, "s1", 0, nil, defaultRing)
	if err != nil {
		t.Fatal(err)
	}
	a.Input([]byte("hello\n"))
	collect(t, a, "hello\r\nhello\r\n")
	a.Close()
	// Output while nobody is attached is retained.
	b, err := c.Attach(ctx, "s1", 0, nil, defaultRing)
	if err != nil {
		t.Fatal(err)
	}
	b.Input([]byte("again\n"))
	collect(t, b, "again\r\nagain\r\n")
	b.Close()
	list, _ := c.Sessions(ctx)
	if len(list) != 1 || list[0].OutputOffset != int64(len("hello\r\nhello\r\nagain\r\nagain\r\n")) {
		t.Fatalf("list: %+v", list)
	}
	// since replays exactly the missed bytes.
	d, err := c.Attach(ctx, "s1", 14, nil, defaultRing)
	if err != nil {
		t.Fatal(err)
	}
	if d.From != 14 || string(d.Replay) != "again\r\nagain\r\n" {
		t.Fatalf("replay from %d: %q", d.From, d.Replay)
	}
	d.Input([]byte{4}) // ^D: cat exits
	_, ev := collect(t, d, "\x00never")
	if ev == nil || ev.Code != 0 {
		t.Fatalf("exit: %+v", ev)
	}
	d.Close()
	if err := c.DeleteSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Attach(ctx, "s1", 0, nil, defaultRing); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("attach deleted: %v", err)
	}
}

func TestSessionPipeDeferred(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	info, err := c.StartSession(ctx, "p1", providers.ProcessSpec{Command: "read x; echo out $x; echo err >&2; exit 7"}, true, 0)
	if err != nil || info.Started {
		t.Fatalf("deferred: %+v %v", info, err)
	}
	pipe := false
	a, err := c.Attach(ctx, "p1", 0, &pipe, defaultRing)
	if err != nil || a.Info.TTY {
		t.Fatalf("attach: %+v %v", a, err)
	}
	a.Input([]byte("x\n"))
	var out, errOut string
	for {
		ev, err := a.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Exited {
			if ev.Code != 7 {
				t.Fatalf("exit %d", ev.Code)
			}
			break
		}
		if ev.Chan == 2 {
			errOut += string(ev.Data)
		} else {
			out += string(ev.Data)
		}
	}
	a.Close()
	if out != "out x\n" || errOut != "err\n" {
		t.Fatalf("stdout %q stderr %q", out, errOut)
	}
}

func TestVersionMismatch(t *testing.T) {
	srv := NewServer(false)
	defer srv.Close()
	_, b, served := servePipe(srv)
	_, err := dial(context.Background(), b, "99") // a gateway of another protocol version
	<-served
	if err == nil || !strings.Contains(err.Error(), "99") || !strings.Contains(err.Error(), "speaks "+Version) {
		t.Fatalf("mismatch: %v", err)
	}
}

func TestConnectionGone(t *testing.T) {
	srv := NewServer(false)
	defer srv.Close()
	a, b, served := servePipe(srv)
	c, err := Dial(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	<-served
	<-c.Done()
	if _, err := c.Exec(context.Background(), providers.ExecRequest{Command: "true", Timeout: time.Second}); !errors.Is(err, ErrGone) {
		t.Fatalf("exec on a dead connection: %v", err)
	}
}

// TestHostileAgent: the gateway reads its agent as code it does not
// trust (the sandbox can replace it): an agent that never answers is
// given up on, and an oversize reply is a violation, not an allocation
// (liar_test.go has the other lies).
func TestHostileAgent(t *testing.T) {
	a, b := net.Pipe()
	served := make(chan struct{})
	go func() {
		defer close(served)
		ys, err := yamux.Server(a, muxConfig())
		if err != nil {
			return
		}
		defer ys.Close()
		for {
			st, err := ys.AcceptStream()
			if err != nil {
				return
			}
			var req request
			readMsg(st, &req, maxRequest)
			switch req.Op {
			case opHello:
				writeMsg(st, reply{Version: Version})
			case opExec:
				writeMsg(st, reply{})
				if req.Exec.Command == "mute" {
					// Never answers: the gateway gives up, closing the
					// stream (which cancels the command).
					io.Copy(io.Discard, st)
					break
				}
				chunk := bytes.Repeat([]byte("x"), 64<<10)
				for range 80 { // 5 MiB, far over the cap
					writeFrame(st, frameStdout, chunk)
				}
				writeFrame(st, frameResult, []byte(`{"exit_code":0}`))
			case opList:
				// A 2 MiB reply.
				writeMsg(st, reply{Error: strings.Repeat("e", 2<<20)})
			}
			st.Close()
		}
	}()
	c, err := Dial(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer func(g time.Duration) { answerGrace = g }(answerGrace)
	answerGrace = 100 * time.Millisecond
	if _, err := c.Exec(context.Background(), providers.ExecRequest{Command: "mute", Timeout: 100 * time.Millisecond}); !errors.Is(err, providers.ErrUnavailable) || !strings.Contains(err.Error(), "no result") {
		t.Fatalf("an agent that never answers: %v", err)
	}
	// The connection is still good.
	if _, err := c.Exec(context.Background(), providers.ExecRequest{Command: "x", Timeout: time.Second, MaxOutput: 5 << 20}); err != nil {
		t.Fatalf("exec after a mute one: %v", err)
	}
	if _, err := c.Sessions(context.Background()); !errors.Is(err, ErrViolation) || !strings.Contains(err.Error(), "over 1048576") {
		t.Fatalf("oversize reply: %v", err)
	}
	c.Close()
	<-served
}

// A subscriber counts from its attach: while its replay is still being
// sent, the process is held back rather than overwriting what the
// subscriber has yet to send (it used to register only after the replay
// and get the slow frame at once when the process wrote a ring meanwhile).
func TestAttachHoldsDuringReplay(t *testing.T) {
	srv := NewServer(true)
	defer srv.Close()
	const ring = 256 << 10
	if _, err := srv.startSession(context.Background(), startRequest{ID: "y", Spec: providers.ProcessSpec{Command: "yes"}, RingBytes: ring}); err != nil {
		t.Fatal(err)
	}
	defer srv.deleteSession("y")
	srv.mu.Lock()
	ss := srv.sessions["y"]
	srv.mu.Unlock()
	total := func() int64 {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return ss.ring.Total()
	}
	waitUntil(t, "a full ring", func() bool { return total() > ring })

	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.attach(a, request{Op: opAttach, Session: "y"})
	}()
	defer func() { b.Close(); <-done }()
	var rep reply
	if err := readMsg(b, &rep, maxReply); err != nil || rep.Error != "" {
		t.Fatalf("attach: %+v %v", rep, err)
	}
	// The replay waits in the pipe; the process runs on to half a ring.
	waitUntil(t, "half a ring more output", func() bool { return total() >= rep.Replay+ring+ring/2 })
	got := 0
	for got < 4*ring {
		typ, p, err := readFrameMax(b, nil, ring)
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case frameSlow:
			t.Fatalf("slow frame after %d bytes", got)
		case frameReplay, frameStdout:
			got += len(p)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLastWords(t *testing.T) {
	dir := t.TempDir()
	if got := lastWords(filepath.Join(dir, "none.log")); got != "" {
		t.Fatalf("no log: %q", got)
	}
	p := filepath.Join(dir, "a.log")
	os.WriteFile(p, []byte("\nruntime: failed to create new OS thread (have 17 already; errno=11)\nruntime: may need to increase max user processes\n"+strings.Repeat("x", 1000)), 0o600)
	if got := lastWords(p); got != "; its last words: runtime: failed to create new OS thread (have 17 already; errno=11)" {
		t.Fatalf("last words %q", got)
	}
	os.WriteFile(p, []byte(strings.Repeat("y", 1000)), 0o600)
	if got := lastWords(p); len(got) > 330 || !strings.HasSuffix(got, "y...") {
		t.Fatalf("long last words %q", got)
	}
	if logPath(SocketPath) != "/dev/.sandgate-agent.log" {
		t.Fatalf("log path %q", logPath(SocketPath))
	}
}

// An attachment that waits for output holds little, even after a burst:
// a gateway keeps one per attached terminal, and 1,000 idle ones must fit
// in well under 100 MiB (SPEC §11). A 64 KiB read buffer each once made
// them 70 MiB; each kept its largest frame (up to 128 KiB) and its yamux
// stream the buffer of its largest burst (up to its 1 MiB window).
func TestIdleAttachmentsAreSmall(t *testing.T) {
	defer func(d time.Duration) { shrinkAfter = d }(shrinkAfter)
	shrinkAfter = time.Millisecond
	_, c := pair(t)
	ctx := context.Background()
	const burst = 300_000
	cmd := fmt.Sprintf("read go; head -c %d /dev/zero | tr '\\0' x; exec sleep 3600", burst)
	if _, err := c.StartSession(ctx, "idle", providers.ProcessSpec{Command: cmd}, false, 0); err != nil {
		t.Fatal(err)
	}
	heap := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	var wg sync.WaitGroup
	var atts []*Attachment
	defer func() {
		for _, a := range atts {
			a.Close()
		}
		wg.Wait()
	}()
	// attach adds an attachment that reads the burst (live for the first,
	// as its replay for the others) and then waits, as the gateway's
	// feeder does, until closed.
	attach := func() *Attachment {
		a, err := c.Attach(ctx, "idle", 0, nil, defaultRing)
		if err != nil {
			t.Fatal(err)
		}
		atts = append(atts, a)
		got := len(a.Replay)
		a.Replay = nil // as its users do
		if len(atts) == 1 {
			a.Input([]byte("go\n"))
		}
		for got < burst {
			ev, err := a.Next()
			if err != nil || ev.Exited {
				t.Fatalf("attachment %d after %d bytes: %+v %v", len(atts), got, ev, err)
			}
			got += len(ev.Data)
		}
		wg.Go(func() { a.Next() })
		return a
	}
	// The first pays for what is paid once (the session's ring, the
	// connection's buffers).
	live := attach()
	h0 := heap()
	const n = 50
	for range n {
		attach()
	}
	var perAttachment int64
	for deadline := time.Now().Add(10 * time.Second); ; {
		if perAttachment = (heap() - h0) / n; perAttachment <= 32<<10 || time.Now().After(deadline) {
			break // the streams let their buffers go shrinkAfter after their last read
		}
	}
	t.Logf("%d bytes of heap per idle attachment (both ends)", perAttachment)
	if perAttachment > 32<<10 {
		t.Fatalf("an idle attachment holds %d bytes of heap (both ends of the agent protocol), want ≤ 32 KiB", perAttachment)
	}
	for _, a := range atts {
		a.Close()
	}
	wg.Wait()
	if live.buf != nil {
		t.Fatalf("an attachment that waited holds its last payload's buffer (%d bytes)", cap(*live.buf))
	}
	if err := c.DeleteSession(ctx, "idle"); err != nil {
		t.Fatal(err)
	}
}
