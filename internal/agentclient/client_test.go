package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair serves a fresh agent server on one end of a pipe and dials the
// other. The server is the test process's subreaper, as the agent is the
// sandbox's.
func pair(t testing.TB) (*agent.Server, *Client) {
	t.Helper()
	srv := agent.NewServer(true)
	t.Cleanup(srv.Close) // after the client's close and Serve's return
	return srv, testkit.DialPipe(t, serveOn(srv), func(b net.Conn) (*Client, error) {
		return Dial(context.Background(), b)
	})
}

// serveOn returns a serve function for testkit.ServePipe: srv serves the
// connection it is given.
func serveOn(srv *agent.Server) func(net.Conn) {
	return func(a net.Conn) { srv.Serve(a, nil) }
}

func TestVersionMismatch(t *testing.T) {
	srv := agent.NewServer(false)
	defer srv.Close()
	_, b, served := testkit.ServePipe(serveOn(srv))
	_, err := dial(context.Background(), b, "99") // a gateway of another protocol version
	<-served
	if err == nil || !strings.Contains(err.Error(), "99") || !strings.Contains(err.Error(), "speaks "+agentwire.Version) {
		t.Fatalf("mismatch: %v", err)
	}
}

func TestConnectionGone(t *testing.T) {
	srv := agent.NewServer(false)
	defer srv.Close()
	a, b, served := testkit.ServePipe(serveOn(srv))
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
	heap := func() int64 { return int64(heapAlloc()) }
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
		a, err := c.Attach(ctx, "idle", 0, nil, agentwire.DefaultRing)
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

// A write whose source fails part way returns the source's error at once
// (the agent is told the body ended, answers, and is not left waiting for
// the rest while the write waits for its answer).
func TestWriteFileSourceFails(t *testing.T) {
	_, c := pair(t)
	want := errors.New("the source broke")
	src := io.MultiReader(strings.NewReader("some bytes"), iotest.ErrReader(want))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // catches a hang only
	defer cancel()
	p := t.TempDir() + "/f"
	if _, err := c.WriteFile(ctx, p, src); !errors.Is(err, want) {
		t.Fatalf("write from a failing source: %v, want %v", err, want)
	}
	if ctx.Err() != nil {
		t.Fatal("the write waited for its context to end")
	}
}
