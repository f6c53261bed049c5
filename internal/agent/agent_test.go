package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestMain(m *testing.M) {
	if os.Getenv(echoHelperEnv) == "1" {
		echoHelper() // BenchmarkIdleWake's other process
		return
	}
	goleak.VerifyTestMain(m)
}

// pair serves a fresh server on one end of a pipe and dials the other.
// The server is the test process's subreaper, as the agent is the
// sandbox's.
func pair(t testing.TB) (*Server, *agentclient.Client) {
	t.Helper()
	srv := NewServer(true)
	t.Cleanup(srv.Close) // after the client's close and Serve's return
	return srv, testkit.DialPipe(t, func(a net.Conn) { srv.Serve(a, nil) }, func(b net.Conn) (*agentclient.Client, error) {
		return agentclient.Dial(context.Background(), b)
	})
}

func run(t *testing.T, c *agentclient.Client, req providers.ExecRequest) providers.ExecResult {
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
func collect(t *testing.T, a *agentclient.Attachment, want string) (string, *agentclient.Event) {
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
func pairDirect(t testing.TB) (*Server, *agentclient.Client) {
	t.Helper()
	srv := NewServer(true)
	return srv, serveSocket(t, srv)
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

func sessionReplay(t *testing.T, c *agentclient.Client) {
	ctx := context.Background()
	info, err := c.StartSession(ctx, "s1", providers.ProcessSpec{Command: "cat", TTY: true, Rows: 30, Cols: 100}, false, 0)
	if err != nil || !info.Running || !info.TTY {
		t.Fatalf("start: %+v %v", info, err)
	}
	a, err := c.Attach(ctx, "s1", 0, nil, agentwire.DefaultRing)
	if err != nil {
		t.Fatal(err)
	}
	a.Input([]byte("hello\n"))
	collect(t, a, "hello\r\nhello\r\n")
	a.Close()
	// Output while nobody is attached is retained.
	b, err := c.Attach(ctx, "s1", 0, nil, agentwire.DefaultRing)
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
	d, err := c.Attach(ctx, "s1", 14, nil, agentwire.DefaultRing)
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
	if _, err := c.Attach(ctx, "s1", 0, nil, agentwire.DefaultRing); !errors.Is(err, providers.ErrNotFound) {
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
	a, err := c.Attach(ctx, "p1", 0, &pipe, agentwire.DefaultRing)
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

// A subscriber counts from its attach: while its replay is still being
// sent, the process is held back rather than overwriting what the
// subscriber has yet to send (it used to register only after the replay
// and get the slow frame at once when the process wrote a ring meanwhile).
func TestAttachHoldsDuringReplay(t *testing.T) {
	srv := NewServer(true)
	t.Cleanup(srv.Close)
	const ring = 256 << 10
	ss, b, rep := yesAttached(t, srv, ring)
	total := func() int64 {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return ss.ring.Total()
	}
	// The replay waits in the pipe; the process runs on to half a ring.
	waitUntil(t, "half a ring more output", func() bool { return total() >= rep.Replay+ring+ring/2 })
	readWithoutSlow(t, b, ring, 4*ring)
}

// A subscriber taking its output slowly but steadily holds the process
// back and is kept, even when one frame (up to a ring, as its replay is)
// takes it longer than stallAfter: it never gets the slow frame.
func TestSteadySlowSubscriberKept(t *testing.T) {
	srv := NewServer(true)
	t.Cleanup(srv.Close)
	srv.stallAfter = time.Second
	// A progressChunk every 250 ms, far within stallAfter; the replay, a
	// full ring, takes 2 s.
	const ring, rate, want = 2 << 20, 1 << 20, 5 << 19 // bytes, bytes/s, bytes
	_, b, _ := yesAttached(t, srv, ring)
	readWithoutSlow(t, &pacedReader{r: b, rate: rate, start: time.Now()}, ring, want)
}

// readWithoutSlow reads an attachment's frames (of at most ring bytes)
// from r until want bytes of output came, failing on the slow frame.
func readWithoutSlow(t *testing.T, r io.Reader, ring, want int) {
	t.Helper()
	for got := 0; got < want; {
		typ, p, err := agentwire.ReadFrameMax(r, nil, uint32(ring))
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case agentwire.FrameSlow:
			t.Fatalf("slow frame after %d bytes", got)
		case agentwire.FrameReplay, agentwire.FrameStdout:
			got += len(p)
		}
	}
}

// yesAttached starts `yes` as session "y" of srv with a ring of ring
// bytes, waits until it has written more than the ring, and attaches to it
// over a pipe; it returns the session, the client's end of the pipe, and
// the attach reply. All of it ends with t.
func yesAttached(t *testing.T, srv *Server, ring int) (*session, net.Conn, agentwire.Reply) {
	t.Helper()
	if _, err := srv.startSession(context.Background(), agentwire.StartRequest{ID: "y", Spec: providers.ProcessSpec{Command: "yes"}, RingBytes: ring}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.deleteSession("y") })
	srv.mu.Lock()
	ss := srv.sessions["y"]
	srv.mu.Unlock()
	waitUntil(t, "a full ring", func() bool {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return ss.ring.Total() > int64(ring)
	})
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.attach(a, agentwire.Request{Op: agentwire.OpAttach, Session: "y"})
	}()
	t.Cleanup(func() { b.Close(); <-done })
	var rep agentwire.Reply
	if err := agentwire.ReadMsg(b, &rep, agentwire.MaxReply); err != nil || rep.Error != "" {
		t.Fatalf("attach: %+v %v", rep, err)
	}
	return ss, b, rep
}

// pacedReader reads from r, 16 KiB at most at a time, at no more than
// rate bytes a second: a slow client.
type pacedReader struct {
	r     io.Reader
	rate  int
	start time.Time
	n     int
}

func (p *pacedReader) Read(b []byte) (int, error) {
	if ahead := time.Duration(p.n)*time.Second/time.Duration(p.rate) - time.Since(p.start); ahead > 0 {
		time.Sleep(ahead) // the slow client's pace
	}
	n, err := p.r.Read(b[:min(len(b), 16<<10)])
	p.n += n
	return n, err
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

// TestListingFitsTheReply: an honest agent cuts a listing that would not
// fit a reply (the gateway takes a longer reply for a lie) and says so.
func TestListingFitsTheReply(t *testing.T) {
	files := make([]providers.FileInfo, providers.MaxDirEntries)
	for i := range files {
		files[i] = providers.FileInfo{Name: strings.Repeat("n", 200), Type: providers.FileSymlink, Target: strings.Repeat("t", 400)}
	}
	rep := fitReply(agentwire.Reply{Files: files})
	b, err := json.Marshal(rep)
	if err != nil || len(b) > agentwire.MaxReply || !rep.Truncated || len(rep.Files) == 0 {
		t.Fatalf("%d entries in %d bytes, truncated %v, %v", len(rep.Files), len(b), rep.Truncated, err)
	}
	small := fitReply(agentwire.Reply{Files: files[:10]})
	if small.Truncated || len(small.Files) != 10 {
		t.Fatalf("a small listing was cut: %d, %v", len(small.Files), small.Truncated)
	}
}

// A pipe-mode session whose output streams reads it in large pieces: its
// stdout pipe is grown to streamPipe, and every byte arrives in order.
func TestSessionPipeStreamGrowsPipe(t *testing.T) {
	// Serial: its command's processes are children of this test binary, and
	// the parallel tests' servers each run a reaper that waits for any
	// child (as the sandbox's one agent must): one of them took this
	// test's, whose exit then never came (a rehearsal hung here).
	srv, c := pairDirect(t)
	ctx := context.Background()
	const size = 1 << 20
	if _, err := c.StartSession(ctx, "big", providers.ProcessSpec{Command: fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; cat >/dev/null", size)}, false, 0); err != nil {
		t.Fatal(err)
	}
	a, err := c.Attach(ctx, "big", 0, nil, agentwire.DefaultRing)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	got := len(a.Replay)
	for got < size {
		ev, err := a.Next()
		if err != nil || ev.Exited {
			t.Fatalf("after %d bytes: %+v %v", got, ev, err)
		}
		if i := bytes.IndexFunc(ev.Data, func(r rune) bool { return r != 'x' }); i >= 0 {
			t.Fatalf("byte %d is %q", got+i, ev.Data[i])
		}
		got += len(ev.Data)
	}
	srv.mu.Lock()
	ss := srv.sessions["big"]
	srv.mu.Unlock()
	var pipeSize int
	if err := control(ss.started().outR, func(fd int) (err error) {
		pipeSize, err = unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if pipeSize != streamPipe || srv.grownPipes.Load() != 1 {
		t.Fatalf("stdout pipe of %d bytes after %d of streaming output, %d grown; want %d, 1", pipeSize, size, srv.grownPipes.Load(), streamPipe)
	}
	a.CloseStdin()
	if _, ev := collect(t, a, "\x00never"); ev == nil || ev.Code != 0 || got != size {
		t.Fatalf("exit %+v after %d bytes", ev, got)
	}
	// The exit comes once the readers are done: the pipe no longer counts.
	if n := srv.grownPipes.Load(); n != 0 {
		t.Fatalf("%d pipes still counted as grown after the exit", n)
	}
}

// growPipe grows no more than maxGrownPipes pipes at once, and nothing
// that is not a pipe; a refusal leaves the pipe and the count as they were.
func TestGrowPipeBounded(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	size := func() int {
		var n int
		control(r, func(fd int) (err error) {
			n, err = unix.FcntlInt(uintptr(fd), unix.F_GETPIPE_SZ, 0)
			return err
		})
		return n
	}
	before := size()
	var grown atomic.Int32
	grown.Store(maxGrownPipes)
	if growPipe(r, &grown) || size() != before || grown.Load() != maxGrownPipes {
		t.Fatalf("over the bound: pipe %d bytes (was %d), %d grown", size(), before, grown.Load())
	}
	if growPipe(strings.NewReader("not a pipe"), &grown) || grown.Load() != maxGrownPipes {
		t.Fatalf("a reader that is no pipe counted: %d grown", grown.Load())
	}
	grown.Store(maxGrownPipes - 1)
	if !growPipe(r, &grown) || size() != streamPipe || grown.Load() != maxGrownPipes {
		t.Fatalf("under the bound: pipe %d bytes, %d grown", size(), grown.Load())
	}
}
