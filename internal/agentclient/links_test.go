package agentclient

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// hangingLinks are Links whose Open for sandbox "hang" blocks until its
// context ends (a docker exec in a sandbox at its pids limit); for any
// other sandbox it connects to srv once release is closed. opens counts
// the Open calls by sandbox.
type hangingLinks struct {
	*Links
	mu      sync.Mutex
	opens   map[string]int
	release chan struct{}
	served  []<-chan struct{}
	ends    []net.Conn
}

func newHangingLinks(t *testing.T) *hangingLinks {
	srv := agent.NewServer(false)
	h := &hangingLinks{opens: map[string]int{}, release: make(chan struct{})}
	h.Links = &Links{
		Open: func(ctx context.Context, id string, start bool) (io.ReadWriteCloser, func() string, error) {
			h.mu.Lock()
			h.opens[id]++
			h.mu.Unlock()
			if id == "hang" {
				<-ctx.Done()
				return nil, nil, ctx.Err()
			}
			select {
			case <-h.release:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			a, b, served := testkit.ServePipe(serveOn(srv))
			h.mu.Lock()
			h.served, h.ends = append(h.served, served), append(h.ends, a)
			h.mu.Unlock()
			return b, func() string { return "" }, nil
		},
		Running: func(ctx context.Context, id string) error { return nil },
	}
	t.Cleanup(func() {
		h.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for i, a := range h.ends {
			a.Close()
			<-h.served[i]
		}
		srv.Close()
	})
	return h
}

func (h *hangingLinks) openCount(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.opens[id]
}

// TestLinksConnectPerSandbox: a sandbox whose connect hangs delays no
// other sandbox's connect (the old global dial lock made every sandbox
// wait for it), and a caller that gives up on the hanging one returns at
// once.
func TestLinksConnectPerSandbox(t *testing.T) {
	h := newHangingLinks(t)
	close(h.release)
	hangCtx, hangCancel := context.WithCancel(context.Background())
	hung := make(chan error, 1)
	go func() {
		_, err := h.Get(hangCtx, "hang")
		hung <- err
	}()
	// The hanging connect is under way before the other starts.
	for deadline := time.Now().Add(10 * time.Second); h.openCount("hang") == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the hanging sandbox's Open was never called")
		}
		time.Sleep(time.Millisecond) // polling: nothing signals an Open in flight
	}
	defer hangCancel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type got struct {
		c   *Client
		err error
	}
	other := make(chan got, 1)
	go func() {
		c, err := h.Get(ctx, "other")
		other <- got{c, err}
	}()
	var c *Client
	select {
	case g := <-other:
		if g.err != nil {
			t.Fatalf("another sandbox's connect while one hangs: %v", g.err)
		}
		c = g.c
	case <-time.After(20 * time.Second): // generous: the hang, not the time, is the subject
		t.Fatal("another sandbox's connect waits for the hanging one")
	}
	res, err := c.Exec(ctx, providers.ExecRequest{Command: "echo ok", Timeout: 10 * time.Second})
	if err != nil || string(res.Stdout) != "ok\n" {
		t.Fatalf("exec: %q %v", res.Stdout, err)
	}
	select {
	case err := <-hung:
		t.Fatalf("the hanging connect returned: %v", err)
	default:
	}
	hangCancel()
	select {
	case err := <-hung:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the hanging connect: %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a cancelled caller still waits for the hanging connect")
	}
}

// TestLinksShareOneDial: concurrent Gets of one sandbox share one connect
// and get the same connection.
func TestLinksShareOneDial(t *testing.T) {
	h := newHangingLinks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 5
	got := make(chan *Client, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			c, err := h.Get(ctx, "one")
			got <- c
			errs <- err
		}()
	}
	// Every caller waits on the connect before it may finish.
	for deadline := time.Now().Add(20 * time.Second); h.waiters("one") < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d callers wait on the connect, want %d", h.waiters("one"), n)
		}
		time.Sleep(time.Millisecond) // polling: waiting callers signal nothing
	}
	close(h.release)
	var first *Client
	for range n {
		c, err := <-got, <-errs
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = c
		} else if c != first {
			t.Fatal("concurrent Gets got different connections")
		}
	}
	if k := h.openCount("one"); k != 1 {
		t.Fatalf("Open called %d times, want once", k)
	}
}

// waiters is how many callers wait on sandbox id's connect in flight.
func (h *hangingLinks) waiters(id string) int {
	h.Links.mu.Lock()
	defer h.Links.mu.Unlock()
	if e := h.byID[id]; e != nil && e.dial != nil {
		return e.dial.waiters
	}
	return 0
}

// TestLinksAgentOnItsWayOut: a connection taken and closed without a
// hello (an agent dying with its listener still open) is tried once
// more, and that attempt's answer stands: here the bridge finds no agent,
// so the sandbox is broken with that reason.
func TestLinksAgentOnItsWayOut(t *testing.T) {
	var opens int
	l := &Links{
		Open: func(ctx context.Context, id string, start bool) (io.ReadWriteCloser, func() string, error) {
			opens++
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				return nil, nil, err
			}
			syscall.Close(fds[0]) // the agent's end, closed at once
			f := os.NewFile(uintptr(fds[1]), "agent")
			b, err := net.FileConn(f)
			f.Close()
			if err != nil {
				return nil, nil, err
			}
			why := ""
			if opens > 1 {
				why = "no agent answers"
			}
			return b, func() string { return why }, nil
		},
		Running: func(ctx context.Context, id string) error { return nil },
	}
	defer l.Close()
	_, err := l.Get(context.Background(), "sbx-1")
	if !errors.Is(err, providers.ErrConflict) || opens != 2 {
		t.Fatalf("after %d opens: %v, want the sandbox broken after a second", opens, err)
	}
	if why := l.Broken("sbx-1"); why == "" {
		t.Fatal("no reason kept")
	}
}
