package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
)

// --- durable commands ----------------------------------------------------

// commandStart alternates a durable command's start to its end (POST
// .../commands asking for its event stream, read to the exit event; the
// first byte comes with the start) with an /exec of the same command (POST
// to its whole answer).
func (b *bench) commandStart(ctx context.Context) (Result, error) {
	sb, c, err := b.sandboxClient(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.g.delete(ctx, sb)
	const command = "echo hi"
	var cmd, ex []time.Duration
	for range b.o.rounds * b.o.n {
		d, err := timed(func() error {
			first := &firstByte{}
			_, err := c.RunCommand(ctx, sb.ID, api.CommandRequest{Command: command}, client.FollowOptions{Stdout: first})
			if err == nil && first.at.IsZero() {
				err = errors.New("no output")
			}
			return err
		})
		if err != nil {
			return Result{}, fmt.Errorf("command: %w", err)
		}
		cmd = append(cmd, d)
		if d, err = timed(func() error { _, err := b.g.exec(ctx, sb, command); return err }); err != nil {
			return Result{}, err
		}
		ex = append(ex, d)
	}
	bs := series("/exec of the same command", millis(ex))
	r := compare("command start to first byte", b.g.provider, "ms", series("gateway command", millis(cmd)), &bs)
	r.judge("≤ 1.2x /exec", r.Ratio <= 1.2)
	return r, nil
}

// firstByte notes when the first byte was written to it.
type firstByte struct{ at time.Time }

func (f *firstByte) Write(p []byte) (int, error) {
	if f.at.IsZero() && len(p) > 0 {
		f.at = time.Now()
	}
	return len(p), nil
}

// commandStream alternates one command's output followed over the event
// stream with the same command's output through /exec (a pipe read in
// the sandbox, sent whole): payload MB/s of each.
func (b *bench) commandStream(ctx context.Context) (Result, error) {
	sb, c, err := b.sandboxClient(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.g.delete(ctx, sb)
	size := min(b.o.streamBytes, 15<<20) // /exec keeps 16 MiB per stream
	command := outputCmd(size)
	var cmd, ex []float64
	for range b.o.rounds {
		var n countWriter
		d, err := timed(func() error {
			_, err := c.RunCommand(ctx, sb.ID, api.CommandRequest{Command: command}, client.FollowOptions{Stdout: &n})
			return err
		})
		if err != nil {
			return Result{}, fmt.Errorf("command: %w", err)
		}
		if n.n.Load() != int64(size) {
			return Result{}, fmt.Errorf("command output %d bytes, want %d", n.n.Load(), size)
		}
		cmd = append(cmd, mbps(int64(size), d))
		var out string
		if d, err = timed(func() error { var err error; out, err = b.g.exec(ctx, sb, command); return err }); err != nil {
			return Result{}, err
		}
		if len(out) != size {
			return Result{}, fmt.Errorf("exec output %d bytes, want %d", len(out), size)
		}
		ex = append(ex, mbps(int64(size), d))
	}
	bs := series("/exec of the same command", ex)
	r := compare("command output streaming", b.g.provider, "MB/s", series("gateway command", cmd), &bs)
	r.judge("≥ 0.8x /exec", r.Ratio >= 0.8)
	return r, nil
}

// commandsHeld starts many quiet commands (sleep, then one line) and
// holds a long-polling wait open on each, through a proxy that cuts any
// connection idle for 5 s, for the commands' whole life: every result
// must arrive, exact, and the gateway's heap stay small.
func (b *bench) commandsHeld(ctx context.Context) (Result, error) {
	n, life := b.o.heldCommands, b.o.heldFor
	const perBox = 50
	px, err := newIdleProxy(strings.TrimPrefix(b.g.URL, "http://"), 5*time.Second)
	if err != nil {
		return Result{}, err
	}
	defer px.close()
	heap0 := b.g.metric(ctx, "go_memstats_heap_inuse_bytes")
	var sb ref
	var c *client.Client
	ids := make([]string, n)
	boxes := make([]ref, n)
	deadline := time.Now().Add(life)
	for i := range n {
		if i%perBox == 0 {
			if sb, err = b.sandbox(ctx); err != nil {
				return Result{}, err
			}
			defer b.g.delete(context.WithoutCancel(ctx), sb)
			if c, err = client.New(b.g.URL, sb.Tok, b.g.hc); err != nil {
				return Result{}, err
			}
		}
		left := max(time.Until(deadline), time.Second)
		cmd, err := c.StartCommand(ctx, sb.ID, api.CommandRequest{Command: fmt.Sprintf("sleep %.1f; echo done-%d", left.Seconds(), i)})
		if err != nil {
			return Result{}, fmt.Errorf("command %d: %w", i, err)
		}
		ids[i], boxes[i] = cmd.CommandID, sb
	}
	var wg sync.WaitGroup
	var lost atomic.Int64
	var firstErr atomic.Value
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res struct {
				Stdout     string `json:"stdout"`
				ReturnCode *int   `json:"return_code"`
			}
			path := fmt.Sprintf("/v1/sandboxes/%s/commands/%s/wait?timeout_s=300", boxes[i].ID, ids[i])
			body, err := px.do(ctx, path, boxes[i].Tok, &res)
			if err == nil && (res.ReturnCode == nil || *res.ReturnCode != 0 || res.Stdout != fmt.Sprintf("done-%d\n", i)) {
				err = fmt.Errorf("command %d: answer %.300s", i, bytes.TrimSpace(body))
			}
			if err != nil {
				lost.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			}
		}()
	}
	// Half-way through the commands' life, every wait is held.
	select {
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-time.After(time.Until(deadline) / 2):
	}
	heap, live := b.g.metric(ctx, "go_memstats_heap_inuse_bytes"), b.g.metric(ctx, "go_gc_heap_live_bytes")
	wg.Wait()
	r := Result{Scenario: fmt.Sprintf("%d quiet commands held %v through an idle-cutting proxy", n, life.Round(time.Second)),
		Provider: b.g.provider, Unit: "MiB",
		Gateway: series("gateway heap", []float64{heap / (1 << 20)}),
		Extra: map[string]float64{
			"heap before MiB": heap0 / (1 << 20),
			"live heap MiB":   live / (1 << 20),
			"lost results":    float64(lost.Load()),
			"proxy cuts":      float64(px.cuts.Load()),
		}}
	if e := firstErr.Load(); e != nil {
		r.Note = "first error: " + e.(string)
	}
	r.judge("no lost result, heap < 100 MiB", lost.Load() == 0 && heap < 100<<20)
	return r, nil
}

// idleProxy forwards loopback TCP connections to a target and closes any
// that moved no byte either way for idle, as load balancers do.
type idleProxy struct {
	ln     net.Listener
	target string
	idle   time.Duration
	cuts   atomic.Int64
	wg     sync.WaitGroup
	hc     *http.Client
}

func newIdleProxy(target string, idle time.Duration) (*idleProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &idleProxy{ln: ln, target: target, idle: idle,
		hc: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.pump(c)
			}()
		}
	}()
	return p, nil
}

// pump joins c to a new connection to the target until either side ends
// or both are idle for p.idle.
func (p *idleProxy) pump(c net.Conn) {
	defer c.Close()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer u.Close()
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{}, 2)
	copyIdle := func(dst, src net.Conn) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 32<<10)
		for {
			src.SetReadDeadline(time.Now().Add(p.idle))
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, err := dst.Write(buf[:n]); err != nil {
					return
				}
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				if time.Since(time.Unix(0, last.Load())) >= p.idle {
					p.cuts.Add(1)
					return
				}
				continue
			}
			if err != nil {
				return
			}
		}
	}
	go copyIdle(u, c)
	go copyIdle(c, u)
	<-done
	c.Close()
	u.Close()
	<-done
}

// do GETs path through the proxy, on a connection of its own (none is
// kept idle to be cut), and decodes a 200's JSON into out.
func (p *idleProxy) do(ctx context.Context, path, tok string, out any) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+p.ln.Addr().String()+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Sandbox-Lease", tok)
	res, err := p.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return body, fmt.Errorf("read the answer: %w", err)
	}
	if res.StatusCode != 200 {
		return body, fmt.Errorf("status %d: %s", res.StatusCode, body)
	}
	return body, json.Unmarshal(body, out)
}

func (p *idleProxy) close() {
	p.ln.Close()
	p.wg.Wait()
}
