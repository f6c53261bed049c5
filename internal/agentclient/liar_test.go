package agentclient

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// A liar is an agent the sandbox replaced: it speaks the hello honestly
// (it is the same protocol) and then lies on every other stream, as lie
// says. Its streams run on goroutines the test joins.

// lie answers one stream: req is its request, st the stream.
type lie func(req agentwire.Request, st net.Conn)

// serveLiar serves lie on conn (yamux, as an agent does) until conn
// closes; done closes once every stream's goroutine has returned.
func serveLiar(conn net.Conn, l lie) (done <-chan struct{}) {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		var wg sync.WaitGroup
		defer wg.Wait()
		ys, err := yamux.Server(conn, agentwire.MuxConfig())
		if err != nil {
			return
		}
		defer ys.Close()
		for {
			st, err := ys.AcceptStream()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer st.Close()
				var req agentwire.Request
				if agentwire.ReadMsg(st, &req, agentwire.MaxRequest) != nil {
					return
				}
				if req.Op == agentwire.OpHello {
					agentwire.WriteMsg(st, agentwire.Reply{Version: agentwire.Version, Agent: "liar"})
					return
				}
				l(req, st)
			})
		}
	}()
	return ch
}

// dialLiar returns a client of a liar on a pipe; the cleanup closes it
// and waits for the liar.
func dialLiar(t *testing.T, l lie) *Client {
	t.Helper()
	return testkit.DialPipe(t, func(a net.Conn) { <-serveLiar(a, l) }, func(b net.Conn) (*Client, error) {
		return Dial(context.Background(), b)
	})
}

// TestHostileAgent: the gateway reads its agent as code it does not
// trust (the sandbox can replace it): an agent that never answers is
// given up on, and an oversize reply is a violation, not an allocation
// (the other lies are below).
func TestHostileAgent(t *testing.T) {
	c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
		switch req.Op {
		case agentwire.OpExec:
			agentwire.WriteMsg(st, agentwire.Reply{})
			if req.Exec.Command == "mute" {
				// Never answers: the gateway gives up, closing the
				// stream (which cancels the command).
				io.Copy(io.Discard, st)
				return
			}
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			for range 80 {
				agentwire.WriteFrame(st, agentwire.FrameStdout, chunk) // 5 MiB, far over the cap
			}
			agentwire.WriteFrame(st, agentwire.FrameResult, []byte(`{"exit_code":0}`))
		case agentwire.OpList:
			// A 2 MiB reply.
			agentwire.WriteMsg(st, agentwire.Reply{Error: strings.Repeat("e", 2<<20)})
		}
	})
	// A short grace for the mute command only: the next exec moves 5 MiB
	// through a pipe, which on a loaded machine can outlast its timeout
	// plus a short grace, and its outcome must not depend on that.
	grace := answerGrace
	answerGrace = 100 * time.Millisecond
	_, err := c.Exec(context.Background(), providers.ExecRequest{Command: "mute", Timeout: 100 * time.Millisecond})
	answerGrace = grace
	if !errors.Is(err, providers.ErrUnavailable) || !strings.Contains(err.Error(), "no result") {
		t.Fatalf("an agent that never answers: %v", err)
	}
	// The connection is still good.
	if _, err := c.Exec(context.Background(), providers.ExecRequest{Command: "x", Timeout: time.Second, MaxOutput: 5 << 20}); err != nil {
		t.Fatalf("exec after a mute one: %v", err)
	}
	if _, err := c.Sessions(context.Background()); !errors.Is(err, ErrViolation) || !strings.Contains(err.Error(), "over 1048576") {
		t.Fatalf("oversize reply: %v", err)
	}
}

// rawFrame writes a frame header announcing n bytes and then p (which may
// be shorter or longer than n).
func rawFrame(w io.Writer, typ byte, n uint32, p []byte) error {
	var h [5]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], n)
	_, err := w.Write(append(h[:], p...))
	return err
}

// hugeReplay is the replay length a replaced agent announced in the
// attack this guards against.
const hugeReplay = 256 << 20

// replayLiar answers an attach with a replay frame announcing hugeReplay
// bytes, sends 64 KiB of it and then holds the stream until the gateway
// closes it.
func replayLiar(req agentwire.Request, st net.Conn) {
	if req.Op != agentwire.OpAttach {
		agentwire.WriteMsg(st, agentwire.Reply{Error: "no", Kind: "invalid"})
		return
	}
	agentwire.WriteMsg(st, agentwire.Reply{Session: &agentwire.SessionInfo{ID: req.Session, TTY: true, Running: true}})
	rawFrame(st, agentwire.FrameReplay, hugeReplay, make([]byte, 64<<10))
	io.Copy(io.Discard, st)
}

func heapAlloc() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestLyingReplayIsBounded: an agent announcing a 256 MiB replay on each
// of 4 attaches costs the gateway no more than the replay it asked for;
// the attaches fail with the violation, and the connection is closed
// with it (the attack took a gateway from 63 MiB to 1.4 GiB of RSS).
func TestLyingReplayIsBounded(t *testing.T) {
	c := dialLiar(t, replayLiar)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := heapAlloc()
	var peak uint64
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			a, err := c.Attach(ctx, "s", 0, nil, agentwire.DefaultRing)
			if err == nil {
				a.Close()
			}
			errs[i] = err
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapAlloc)
			mu.Unlock()
		})
	}
	wg.Wait()
	after := heapAlloc()
	t.Logf("heap before 4 lying attaches %.1f MiB, at most %.1f MiB during, %.1f MiB after",
		float64(before)/(1<<20), float64(peak)/(1<<20), float64(after)/(1<<20))
	if peak > before+32<<20 {
		t.Fatalf("4 attaches announcing %d-byte replays took the heap from %d to %d bytes", hugeReplay, before, peak)
	}
	const want = "agent protocol violation: replay length 268435456 over 1048576"
	violated := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrViolation):
			violated++
			if !errors.Is(err, providers.ErrConflict) || providers.Message(err) != want {
				t.Errorf("attach %d: %v (kind %v), want the message %q", i, err, providers.Kind(err), want)
			}
		case errors.Is(err, ErrGone): // the first violation closed the connection under it
		default:
			t.Errorf("attach %d: %v, want the violation or the connection gone", i, err)
		}
	}
	if violated == 0 {
		t.Fatalf("no attach met the violation: %v", errs)
	}
	if got := c.Violation(); got != want {
		t.Fatalf("Violation() = %q, want %q", got, want)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection to a lying agent is still open")
	}
}

// TestLiesCloseTheConnection: every kind of lie ends the call with the
// violation and closes the connection; none panics or allocates what it
// announces.
func TestLiesCloseTheConnection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	attach := func(c *Client) error {
		a, err := c.Attach(ctx, "s", 0, nil, agentwire.DefaultRing)
		if err != nil {
			return err
		}
		defer a.Close()
		for {
			ev, err := a.Next()
			if err != nil || ev.Exited {
				return err
			}
		}
	}
	session := &agentwire.SessionInfo{ID: "s", Running: true}
	for _, tc := range []struct {
		name string
		lie  lie
		call func(c *Client) error
		want string
	}{{
		name: "reply over its bound",
		lie: func(req agentwire.Request, st net.Conn) {
			binary.Write(st, binary.BigEndian, uint32(1<<31))
			io.Copy(io.Discard, st)
		},
		call: func(c *Client) error { _, err := c.Sessions(ctx); return err },
		want: "message length 2147483648 over 1048576",
	}, {
		name: "reply not JSON",
		lie: func(req agentwire.Request, st net.Conn) {
			binary.Write(st, binary.BigEndian, uint32(3))
			st.Write([]byte("}{x"))
		},
		call: func(c *Client) error { _, err := c.StatFile(ctx, "/x"); return err },
		want: "a message that is not JSON",
	}, {
		name: "start without its session",
		lie:  func(req agentwire.Request, st net.Conn) { agentwire.WriteMsg(st, agentwire.Reply{}) },
		call: func(c *Client) error {
			_, err := c.StartSession(ctx, "s", providers.ProcessSpec{}, false, agentwire.DefaultRing)
			return err
		},
		want: "session.start reply without the session",
	}, {
		name: "attach without its session",
		lie:  func(req agentwire.Request, st net.Conn) { agentwire.WriteMsg(st, agentwire.Reply{}) },
		call: attach,
		want: "attach reply without the session",
	}, {
		name: "output before the replay",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{Session: session})
			agentwire.WriteFrame(st, agentwire.FrameStdout, []byte("x"))
		},
		call: attach,
		want: `frame 'o' before the replay`,
	}, {
		name: "frame over its bound",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{Session: session})
			agentwire.WriteFrame(st, agentwire.FrameReplay, nil)
			rawFrame(st, agentwire.FrameStdout, 1<<30, nil)
			io.Copy(io.Discard, st)
		},
		call: attach,
		want: "frame length 1073741824 over 1048576",
	}, {
		name: "unknown frame on an attachment",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{Session: session})
			agentwire.WriteFrame(st, agentwire.FrameReplay, nil)
			agentwire.WriteFrame(st, 'Q', []byte("?"))
		},
		call: attach,
		want: `frame 'Q' on an attachment`,
	}, {
		name: "exit not JSON",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{Session: session})
			agentwire.WriteFrame(st, agentwire.FrameReplay, nil)
			agentwire.WriteFrame(st, agentwire.FrameExit, []byte("{"))
		},
		call: attach,
		want: "an exit frame that is not JSON",
	}, {
		name: "exec output over its cap",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{})
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			for range 80 { // 5 MiB, far over the cap
				if agentwire.WriteFrame(st, agentwire.FrameStdout, chunk) != nil {
					return
				}
			}
			agentwire.WriteFrame(st, agentwire.FrameResult, []byte(`{"exit_code":0}`))
		},
		call: func(c *Client) error {
			_, err := c.Exec(ctx, providers.ExecRequest{Command: "x", Timeout: time.Second, MaxOutput: 1000})
			return err
		},
		want: "exec stdout over its cap of 1000 bytes",
	}, {
		name: "exec result not JSON",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{})
			agentwire.WriteFrame(st, agentwire.FrameResult, []byte("nope"))
		},
		call: func(c *Client) error {
			_, err := c.Exec(ctx, providers.ExecRequest{Command: "x", Timeout: time.Second})
			return err
		},
		want: "an exec result that is not JSON",
	}, {
		name: "unknown frame on an exec",
		lie: func(req agentwire.Request, st net.Conn) {
			agentwire.WriteMsg(st, agentwire.Reply{})
			agentwire.WriteFrame(st, agentwire.FrameReplay, []byte("x"))
		},
		call: func(c *Client) error {
			_, err := c.Exec(ctx, providers.ExecRequest{Command: "x", Timeout: time.Second})
			return err
		},
		want: `frame 'R' on an exec stream`,
	}, {
		name: "file size negative",
		lie:  func(req agentwire.Request, st net.Conn) { agentwire.WriteMsg(st, agentwire.Reply{Size: -1}) },
		call: func(c *Client) error { _, _, err := c.ReadFile(ctx, "/x"); return err },
		want: "file size -1",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialLiar(t, tc.lie)
			err := tc.call(c)
			if !errors.Is(err, ErrViolation) || !errors.Is(err, providers.ErrConflict) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a violation saying %q", err, tc.want)
			}
			if !strings.HasPrefix(c.Violation(), "agent protocol violation: ") || !strings.Contains(c.Violation(), tc.want) {
				t.Fatalf("Violation() = %q", c.Violation())
			}
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the connection is still open")
			}
		})
	}
}

// TestLyingFileStream: a file stream ends at the size the agent
// announced; a byte more is a violation, and what follows it is never
// read (the attack streamed 1.96 GB through a download capped at 64 MiB).
func TestLyingFileStream(t *testing.T) {
	const announced = 1000
	c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
		agentwire.WriteMsg(st, agentwire.Reply{Size: announced})
		chunk := make([]byte, 64<<10)
		for range 1600 { // 100 MiB
			if _, err := st.Write(chunk); err != nil {
				return
			}
		}
	})
	before := heapAlloc()
	r, size, err := c.ReadFile(context.Background(), "/f")
	if err != nil || size != announced {
		t.Fatalf("read: %d %v", size, err)
	}
	defer r.Close()
	n, err := io.Copy(io.Discard, r)
	if n != announced || !errors.Is(err, ErrViolation) || !strings.Contains(err.Error(), "a file stream longer than the 1000 bytes announced") {
		t.Fatalf("read %d bytes, %v; want %d and the violation", n, err, announced)
	}
	if after := heapAlloc(); after > before+16<<20 {
		t.Fatalf("heap grew from %d to %d", before, after)
	}
	<-c.Done()
}

// TestHonestFileStreamEnds: the check at the end of a file costs an
// honest agent nothing (its stream ends with the file).
func TestHonestFileStreamEnds(t *testing.T) {
	c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
		agentwire.WriteMsg(st, agentwire.Reply{Size: 5})
		st.Write([]byte("hello"))
	})
	r, _, err := c.ReadFile(context.Background(), "/f")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	b, err := io.ReadAll(r)
	if string(b) != "hello" || err != nil || time.Since(start) > endGrace/2 || c.Violation() != "" {
		t.Fatalf("read %q, %v after %v; violation %q", b, err, time.Since(start), c.Violation())
	}
}

// TestLinksMarkALiarBroken: through Links (docker, kubernetes), a
// sandbox whose agent lied is broken with the violation as its reason
// and is not reconnected; another sandbox's agent is served as before.
func TestLinksMarkALiarBroken(t *testing.T) {
	srv := agent.NewServer(false)
	defer srv.Close()
	var mu sync.Mutex
	var cleanups []func()
	defer func() {
		for _, f := range cleanups {
			f()
		}
	}()
	dials := map[string]int{}
	l := &Links{
		Open: func(ctx context.Context, id string, start bool) (io.ReadWriteCloser, func() string, error) {
			a, b := net.Pipe()
			mu.Lock()
			defer mu.Unlock()
			dials[id]++
			if id == "liar" {
				done := serveLiar(a, replayLiar)
				cleanups = append(cleanups, func() { a.Close(); <-done })
			} else {
				served := make(chan struct{})
				go func() { defer close(served); srv.Serve(a, nil) }()
				cleanups = append(cleanups, func() { a.Close(); <-served })
			}
			return b, func() string { return "" }, nil
		},
		Running: func(ctx context.Context, id string) error { return nil },
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	liar, err := l.Get(ctx, "liar")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := liar.Attach(ctx, "s", 0, nil, agentwire.DefaultRing); !errors.Is(err, ErrViolation) {
		t.Fatalf("attach to a liar: %v", err)
	}
	const why = "agent protocol violation: replay length 268435456 over 1048576"
	if got := l.Broken("liar"); got != why {
		t.Fatalf("Broken = %q, want %q", got, why)
	}
	if _, err := l.Get(ctx, "liar"); !errors.Is(err, providers.ErrConflict) || !strings.Contains(err.Error(), why) {
		t.Fatalf("get after the lie: %v", err)
	}
	good, err := l.Get(ctx, "good")
	if err != nil {
		t.Fatal(err)
	}
	res, err := good.Exec(ctx, providers.ExecRequest{Command: "echo fine", Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "fine\n" {
		t.Fatalf("the other sandbox: %q %v", res.Stdout, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if dials["liar"] != 1 {
		t.Fatalf("the liar was dialled %d times, want once (no reconnect)", dials["liar"])
	}
}

// TestOutputFrameInPieces: an output frame larger than a pooled buffer
// (an agent's pipe-mode frames are as large as what is pending) is
// returned a buffer at a time, in order and whole, and the frames after
// it are read as usual; one cut short is an error, not a short event.
func TestOutputFrameInPieces(t *testing.T) {
	big := make([]byte, 2*agentwire.CoalesceTTY+1000)
	for i := range big {
		big[i] = byte(i % 251)
	}
	full := bytes.Repeat([]byte("f"), agentwire.CoalesceTTY)
	session := &agentwire.SessionInfo{ID: "s", Running: true}
	c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
		agentwire.WriteMsg(st, agentwire.Reply{Session: session})
		agentwire.WriteFrame(st, agentwire.FrameReplay, nil)
		if req.Since == 1 {
			rawFrame(st, agentwire.FrameStdout, uint32(len(big)), big[:agentwire.CoalesceTTY+10])
			return // cut short
		}
		agentwire.WriteFrame(st, agentwire.FrameStdout, big)
		agentwire.WriteFrame(st, agentwire.FrameStderr, []byte("e"))
		agentwire.WriteFrame(st, agentwire.FrameStdout, full)
		agentwire.WriteFrame(st, agentwire.FrameExit, []byte(`{"code":3}`))
		io.Copy(io.Discard, st)
	})
	ctx := testkit.Context(t, time.Minute)
	a, err := c.Attach(ctx, "s", 0, nil, agentwire.DefaultRing)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	type piece struct {
		ch byte
		n  int
	}
	var got []piece
	var out, errs []byte
	for {
		ev, err := a.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Exited {
			if ev.Code != 3 {
				t.Fatalf("exit %d, want 3", ev.Code)
			}
			break
		}
		got = append(got, piece{ev.Chan, len(ev.Data)})
		if ev.Chan == 0x02 {
			errs = append(errs, ev.Data...)
		} else {
			out = append(out, ev.Data...)
		}
	}
	k := agentwire.CoalesceTTY
	want := []piece{{0x01, k}, {0x01, k}, {0x01, 1000}, {0x02, 1}, {0x01, k}}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if !bytes.Equal(out, append(slices.Clone(big), full...)) || string(errs) != "e" {
		t.Fatal("the output's bytes differ from what the agent sent")
	}

	a2, err := c.Attach(ctx, "s", 1, nil, agentwire.DefaultRing)
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if ev, err := a2.Next(); err != nil || len(ev.Data) != k {
		t.Fatalf("first piece of the cut frame: %d bytes, %v", len(ev.Data), err)
	}
	if _, err := a2.Next(); err == nil {
		t.Fatal("a frame cut short was returned as output")
	}
}
