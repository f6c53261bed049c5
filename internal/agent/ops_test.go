package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// dirFiles is a Files over a directory of the test's: paths resolve
// under it (the local provider's sandboxFiles is tested with real
// sandboxes).
type dirFiles struct{ dir string }

func (d dirFiles) Open(p string, write bool) (*os.File, error) {
	if write {
		return os.Create(filepath.Join(d.dir, p))
	}
	f, err := os.Open(filepath.Join(d.dir, p))
	if errors.Is(err, os.ErrNotExist) {
		return nil, providers.Errorf(providers.ErrNotFound, "no such file")
	}
	return f, err
}

func (d dirFiles) Stat(p string) (providers.FileInfo, error) {
	return statPath(filepath.Join(d.dir, p))
}

func (d dirFiles) Spill() (*os.File, error) { return SpillFile(d.dir) }

func (d dirFiles) Dir(p string) (*os.File, error) { return os.Open(filepath.Join(d.dir, p)) }

func (d dirFiles) List(p string) ([]providers.FileInfo, bool, error) {
	return listPath(filepath.Join(d.dir, p))
}

// serveUnix serves a server with o on a unix socket, as a local
// sandbox's init does, and dials it with direct connections.
func serveUnix(t *testing.T, o Options) *agentclient.Client {
	t.Helper()
	srv := NewServerWith(NewReaper(true), o)
	srv.own = true
	return serveSocket(t, srv)
}

// serveSocket serves srv on a unix socket and returns a client that makes
// a connection of its own for each attachment and file (WithDirect). The
// cleanup closes both.
func serveSocket(t testing.TB, srv *Server) *agentclient.Client {
	t.Helper()
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
			wg.Go(func() { srv.Serve(c, nil) })
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
	c, err := agentclient.Dial(context.Background(), conn, agentclient.WithDirect(dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		l.Close()
		<-served
	})
	return c
}

// TestOpenPassesTheFile: with Files the agent hands over the opened file
// itself, for reading and for writing; the file ops (read, stat) go
// through Files too; errors keep their kind.
func TestOpenPassesTheFile(t *testing.T) {
	dir := t.TempDir()
	c := serveUnix(t, Options{Files: dirFiles{dir}, Forker: 42})
	ctx := testkit.Context(t, time.Minute)
	if c.Forker() != 42 {
		t.Errorf("hello's forker: %d, want 42", c.Forker())
	}
	w, err := c.Open(ctx, "/f", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("through the descriptor"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := c.Open(ctx, "/f", false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil || string(b) != "through the descriptor" {
		t.Fatalf("read back %q %v", b, err)
	}
	if fi, err := c.StatFile(ctx, "/f"); err != nil || fi.Size != int64(len(b)) {
		t.Errorf("stat through Files: %+v %v", fi, err)
	}
	rc, n, err := c.ReadFile(ctx, "/f")
	if err != nil || n != int64(len(b)) {
		t.Fatalf("read op through Files: %d %v", n, err)
	}
	rc.Close()
	if _, err := c.Open(ctx, "/missing", false); providers.Kind(err) != providers.ErrNotFound {
		t.Errorf("open of a missing file: %v, want not found", err)
	}
	if fds := openFDs(t); fds > 64 {
		t.Errorf("%d descriptors open after the opens: one leaks per call?", fds)
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestOpenNeedsAUnixSocket: an agent without Files (in a container)
// opens paths itself, as its other file calls do (a FIFO refused without
// blocking on it); one reached over a stream refuses open.
func TestOpenNeedsAUnixSocket(t *testing.T) {
	dir := t.TempDir()
	c := serveUnix(t, Options{})
	ctx := testkit.Context(t, time.Minute)
	w, err := c.Open(ctx, dir+"/new/f", true)
	if err != nil {
		t.Fatalf("open to write without Files: %v", err)
	}
	w.WriteString("hello")
	w.Close()
	r, err := c.Open(ctx, dir+"/new/f", false)
	if err != nil {
		t.Fatalf("open to read without Files: %v", err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "hello" {
		t.Fatalf("read back %q", b)
	}
	if err := syscall.Mkfifo(dir+"/fifo", 0o600); err != nil {
		t.Fatal(err)
	}
	for _, write := range []bool{false, true} {
		if _, err := c.Open(ctx, dir+"/fifo", write); providers.Kind(err) != providers.ErrInvalid {
			t.Errorf("open a FIFO (write %v): %v, want invalid", write, err)
		}
	}
	if _, err := c.Open(ctx, "relative", false); providers.Kind(err) != providers.ErrInvalid {
		t.Errorf("open a relative path: %v, want invalid", err)
	}
	_, pc := pair(t)
	if _, err := pc.Open(testkit.Context(t, time.Minute), "/etc/hostname", false); providers.Kind(err) != providers.ErrUnsupported {
		t.Errorf("open without a direct connection: %v, want unsupported", err)
	}
}

// TestSpawnAndKillAll: spawn starts the entrypoint in the background in
// the workdir with the server's environment and returns at once; a
// command it cannot find is invalid; kill_all takes down every
// descendant.
func TestSpawnAndKillAll(t *testing.T) {
	dir := t.TempDir()
	c := serveUnix(t, Options{Workdir: dir, Env: []string{"PATH=/usr/bin:/bin", "MARK=spawned"}})
	ctx := testkit.Context(t, time.Minute)
	if err := c.Spawn(ctx, []string{"sh", "-c", `echo $MARK $$ > pid; exec sleep 300`}); err != nil {
		t.Fatal(err)
	}
	var pid int
	testkit.Eventually(t, "the spawned command's pid", 30*time.Second, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "pid"))
		f := strings.Fields(string(b))
		if len(f) == 2 && f[0] == "spawned" {
			pid, _ = strconv.Atoi(f[1])
		}
		return pid > 0
	})
	if err := c.Spawn(ctx, []string{"no-such-command"}); providers.Kind(err) != providers.ErrInvalid || !strings.Contains(err.Error(), "not found") {
		t.Errorf("spawn of a missing command: %v, want invalid, not found", err)
	}
	if err := c.Spawn(ctx, nil); providers.Kind(err) != providers.ErrInvalid {
		t.Errorf("spawn without argv: %v, want invalid", err)
	}
	if err := c.KillAll(ctx); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the spawned sleep's end after kill_all", 30*time.Second, func() bool {
		return syscall.Kill(pid, 0) != nil
	})
}

// TestSignalAllNeedsPIDNamespace: kill(-1) outside a sandbox's PID 1
// would reach the host; an agent that is not one refuses, and a bad
// signal is refused before anything is sent.
func TestSignalAllNeedsPIDNamespace(t *testing.T) {
	c := serveUnix(t, Options{})
	ctx := testkit.Context(t, time.Minute)
	if err := c.SignalAll(ctx, syscall.SIGCONT); providers.Kind(err) != providers.ErrUnsupported {
		t.Errorf("signal_all from an agent that is not PID 1: %v, want unsupported", err)
	}
	c = serveUnix(t, Options{PIDNamespace: true})
	for _, sig := range []syscall.Signal{0, -1, 65} {
		if err := c.SignalAll(ctx, sig); providers.Kind(err) != providers.ErrInvalid {
			t.Errorf("signal_all %d: %v, want invalid", sig, err)
		}
	}
}

// A direct connection's send buffer is raised to directSendBuffer (within
// the kernel's net.core.wmem_max), so that a frame of output leaves in
// one write.
func TestDirectSendBuffer(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A second descriptor of the agent's end: Serve closes its own.
	probe, err := unix.Dup(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(probe)
	conns := []net.Conn{fileConn(t, fds[0]), fileConn(t, fds[1])}
	for _, c := range conns {
		defer c.Close()
	}
	sndbuf := func() int {
		n, err := unix.GetsockoptInt(probe, unix.SOL_SOCKET, unix.SO_SNDBUF)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := sndbuf()
	srv := NewServer(true)
	defer srv.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(conns[0], nil)
	}()
	if _, err := conns[1].Write([]byte(agentwire.DirectMagic)); err != nil {
		t.Fatal(err)
	}
	if err := agentwire.WriteMsg(conns[1], agentwire.Request{Op: agentwire.OpList}); err != nil {
		t.Fatal(err)
	}
	var rep agentwire.Reply
	if err := agentwire.ReadMsg(conns[1], &rep, agentwire.MaxReply); err != nil || rep.Error != "" {
		t.Fatalf("list: %+v %v", rep, err)
	}
	<-served
	b, err := os.ReadFile("/proc/sys/net/core/wmem_max")
	if err != nil {
		t.Fatal(err)
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	// The kernel doubles what it is given, for its bookkeeping.
	if want := 2 * min(directSendBuffer, limit); sndbuf() < want {
		t.Fatalf("send buffer %d after a direct call (%d before), want at least %d", sndbuf(), before, want)
	}
}
