package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"html"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
)

// The soak: mixed traffic at a fixed rate for a while (creates, execs,
// file round trips, terminal sessions whose connection is cut and
// re-attached, takeovers), checking every answer and every byte, and
// the gateway's memory over time.

// soakResult is what a soak run found.
type soakResult struct {
	Duration   time.Duration  `json:"duration"`
	Ops        map[string]int `json:"ops"`
	Errors     []string       `json:"errors"`
	Drops      int64          `json:"drops"` // connections cut under an attached session
	HeapWarm   float64        `json:"live_heap_after_warmup_bytes"`
	HeapEnd    float64        `json:"live_heap_at_end_bytes"`
	Samples    []memSample    `json:"memory"`
	MemoryFlat bool           `json:"memory_flat"`
}

type memSample struct {
	At   time.Duration `json:"at"`
	Heap float64       `json:"heap_bytes"`
	RSS  float64       `json:"rss_bytes"`
}

// cutter is a dialer whose connections can all be cut at once: a
// dropped network under every attached client.
type cutter struct {
	mu    sync.Mutex
	conns map[net.Conn]bool
	cuts  *atomic.Int64
}

func (c *cutter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.conns[conn] = true
	c.mu.Unlock()
	return &trackedConn{Conn: conn, c: c}, nil
}

func (c *cutter) cutAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for conn := range c.conns {
		conn.Close()
		c.cuts.Add(1)
	}
	clear(c.conns)
}

type trackedConn struct {
	net.Conn
	c *cutter
}

func (t *trackedConn) Close() error {
	t.c.mu.Lock()
	delete(t.c.conns, t.Conn)
	t.c.mu.Unlock()
	return t.Conn.Close()
}

// soak runs mixed traffic against g for d at rate operations per second.
func soak(ctx context.Context, g *gateway, d time.Duration, rate int, log io.Writer) (*soakResult, error) {
	res := &soakResult{Duration: d, Ops: map[string]int{}}
	var mu sync.Mutex
	fail := func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if len(res.Errors) < 50 {
			res.Errors = append(res.Errors, op+": "+err.Error())
		}
	}
	count := func(op string) {
		mu.Lock()
		res.Ops[op]++
		mu.Unlock()
	}
	var cuts atomic.Int64

	home, err := g.create(ctx, map[string]any{})
	if err != nil {
		return nil, err
	}
	defer g.delete(context.WithoutCancel(ctx), home)

	ops := []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"create+exec+delete", func(ctx context.Context) error {
			sb, err := g.create(ctx, map[string]any{"env": map[string]string{"SOAK": "1"}})
			if err != nil {
				return err
			}
			out, err := g.exec(ctx, sb, "echo $SOAK")
			if err == nil && out != "1\n" {
				err = fmt.Errorf("exec said %q", out)
			}
			if derr := g.delete(ctx, sb); err == nil {
				err = derr
			}
			return err
		}},
		{"exec", func(ctx context.Context) error {
			out, err := g.exec(ctx, home, "echo soak")
			if err == nil && out != "soak\n" {
				err = fmt.Errorf("exec said %q", out)
			}
			return err
		}},
		{"file round trip", func(ctx context.Context) error {
			data := make([]byte, 64<<10)
			rand.Read(data)
			name := fmt.Sprintf("/tmp/soak-%x", data[:6])
			if err := g.upload(ctx, home, name, bytes.NewReader(data)); err != nil {
				return err
			}
			var back bytes.Buffer
			if _, err := g.download(ctx, home, name, &back); err != nil {
				return err
			}
			if !bytes.Equal(back.Bytes(), data) {
				return fmt.Errorf("downloaded %d bytes differ from the %d uploaded", back.Len(), len(data))
			}
			_, err := g.exec(ctx, home, "rm "+name)
			return err
		}},
		{"pty with a dropped connection", func(ctx context.Context) error {
			return soakSession(ctx, g, home, &cuts, false)
		}},
		{"pty takeover", func(ctx context.Context) error {
			return soakSession(ctx, g, home, &cuts, true)
		}},
	}

	start := time.Now()
	sample := func() {
		s := memSample{At: time.Since(start).Round(time.Second), Heap: g.metric(ctx, "go_gc_heap_live_bytes"), RSS: float64(g.status("VmRSS"))}
		mu.Lock()
		res.Samples = append(res.Samples, s)
		mu.Unlock()
	}
	sample()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	memTick := time.NewTicker(max(d/60, time.Second))
	defer memTick.Stop()
	end := time.After(d)
	var wg sync.WaitGroup
	i := 0
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-memTick.C:
			sample()
		case <-tick.C:
			op := ops[i%len(ops)]
			i++
			wg.Add(1)
			go func() {
				defer wg.Done()
				octx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				if err := op.f(octx); err != nil {
					fail(op.name, err)
				}
				count(op.name)
			}()
		}
	}
	wg.Wait()
	sample()
	res.Drops = cuts.Load()
	// Flat: the live heap (what the last collection kept; a window's
	// lowest sample) over the last fifth of the run within 10% (or 1 MiB)
	// of the same over the fifth after warm-up (the first fifth); runs
	// under 5 minutes get 2 MiB.
	low := func(from, to time.Duration) float64 {
		v := 0.0
		for _, s := range res.Samples {
			if s.At >= from && s.At <= to && (v == 0 || s.Heap < v) {
				v = s.Heap
			}
		}
		return v
	}
	res.HeapWarm, res.HeapEnd = low(d/5, 2*d/5), low(4*d/5, d+time.Minute)
	// A short run (the 60 s one in make test) has had fewer collections
	// to settle on: 2 MiB of slack instead of 1.
	slack := float64(1 << 20)
	if d < 5*time.Minute {
		slack = 2 << 20
	}
	res.MemoryFlat = res.HeapEnd <= max(res.HeapWarm*1.10, res.HeapWarm+slack)
	fmt.Fprintf(log, "soak: %s, %v ops, %d errors, %d connections cut; live heap after warm-up %.1f MiB, at the end %.1f MiB (flat: %v)\n",
		d, res.Ops, len(res.Errors), res.Drops, res.HeapWarm/(1<<20), res.HeapEnd/(1<<20), res.MemoryFlat)
	return res, ctx.Err()
}

// soakSession runs a session that writes a known sequence and reads it
// all: with takeover, a second client evicts the first midway and must
// still get every byte from the start; without, every connection is cut
// midway and the client must re-attach without losing or repeating a
// byte.
func soakSession(ctx context.Context, g *gateway, sb ref, cuts *atomic.Int64, takeover bool) error {
	// The session is made over the gateway's client and attached over a
	// dialer of its own, which cuts this session's connections only.
	rest, err := client.New(g.URL, sb.Tok, g.hc)
	if err != nil {
		return err
	}
	cut := &cutter{conns: map[net.Conn]bool{}, cuts: cuts}
	hc := &http.Client{Transport: &http.Transport{DialContext: cut.dial}}
	defer hc.CloseIdleConnections()
	c, err := client.New(g.URL, sb.Tok, hc)
	if err != nil {
		return err
	}
	const lines = 3000
	cmd, no := fmt.Sprintf("sleep 0.3; seq 1 %d; sleep 0.2; seq 1 %d", lines, lines), false
	if takeover {
		// It ends only after the taking-over client says so: the first
		// client cannot see it end before it is evicted.
		cmd = fmt.Sprintf("seq 1 %d; read go; seq 1 %d", lines, lines)
	}
	id, err := rest.CreateSession(ctx, sb.ID, api.PtyCreateRequest{Command: &cmd, Pty: &no})
	if err != nil {
		return err
	}
	// An ended session is kept (for replay) until deleted, and counts
	// against the sandbox's session limit.
	defer g.do(context.WithoutCancel(ctx), "DELETE", "/v1/sandboxes/"+sb.ID+"/pty/"+id, sb.Tok, nil, nil)
	var want strings.Builder
	for range 2 {
		for i := 1; i <= lines; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
	}
	var out bytes.Buffer
	var lost atomic.Int64
	notify := func(e client.Event) {
		if e.Kind == client.Lost {
			lost.Add(e.Bytes)
		}
	}
	opts := client.AttachOptions{Output: &out, Notify: notify, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	if !takeover {
		// The cut comes once attached, in the middle of the output.
		var once sync.Once
		opts.Notify = func(e client.Event) {
			notify(e)
			if e.Kind == client.Connected {
				once.Do(func() { time.AfterFunc(350*time.Millisecond, cut.cutAll) })
			}
		}
		code, err := c.Attach(ctx, sb.ID, id, opts)
		if err != nil {
			return err
		}
		if code != 0 || lost.Load() != 0 || out.String() != want.String() {
			return fmt.Errorf("after a drop: exit %d, %d bytes lost, %d bytes of %d match", code, lost.Load(), commonPrefix(out.String(), want.String()), want.Len())
		}
		return nil
	}
	first := make(chan error, 1)
	connected := make(chan struct{}, 1)
	var firstOut bytes.Buffer
	go func() {
		_, err := c.Attach(ctx, sb.ID, id, client.AttachOptions{Output: &firstOut, Notify: func(e client.Event) {
			if e.Kind == client.Connected {
				select {
				case connected <- struct{}{}:
				default:
				}
			}
		}})
		first <- err
	}()
	select {
	case <-connected:
	case <-ctx.Done():
		return ctx.Err()
	}
	opts.Takeover = true
	in := make(chan []byte, 1)
	var goAhead sync.Once
	opts.Input = in
	opts.Notify = func(e client.Event) {
		notify(e)
		if e.Kind == client.Connected {
			goAhead.Do(func() { in <- []byte("\n") })
		}
	}
	code, err := c.Attach(ctx, sb.ID, id, opts)
	if err != nil {
		return err
	}
	if ferr := <-first; !errors.Is(ferr, client.ErrTakenOver) {
		return fmt.Errorf("the evicted client ended with %v, want taken over", ferr)
	}
	if code != 0 || lost.Load() != 0 || out.String() != want.String() {
		return fmt.Errorf("after a takeover: exit %d, %d bytes lost, %d bytes of %d match", code, lost.Load(), commonPrefix(out.String(), want.String()), want.Len())
	}
	return nil
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// writeSoak saves the result as soak.json and the memory over time as
// soak.svg under dir.
func writeSoak(res *soakResult, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeJSONFile(filepath.Join(dir, "soak.json"), res); err != nil {
		return err
	}
	const w, h, pad = 640, 240, 40
	var top float64
	for _, s := range res.Samples {
		top = max(top, s.RSS, s.Heap)
	}
	if top == 0 || len(res.Samples) < 2 {
		return nil
	}
	last := float64(res.Samples[len(res.Samples)-1].At)
	pts := func(v func(memSample) float64) string {
		var b strings.Builder
		for _, s := range res.Samples {
			fmt.Fprintf(&b, "%.1f,%.1f ", pad+float64(w-2*pad)*float64(s.At)/last, float64(h-pad)-float64(h-2*pad)*v(s)/top)
		}
		return b.String()
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="13">gateway memory during a %s soak: RSS (grey), Go heap (blue); top %.0f MiB</text>`+"\n", pad, html.EscapeString(res.Duration.String()), top/(1<<20))
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#999" points="%s"/>`+"\n", pts(func(s memSample) float64 { return s.RSS }))
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#1f77b4" points="%s"/>`+"\n", pts(func(s memSample) float64 { return s.Heap }))
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#000"/>`+"\n", pad, w-pad, h-pad, h-pad)
	b.WriteString("</svg>\n")
	return os.WriteFile(filepath.Join(dir, "soak.svg"), []byte(b.String()), 0o644)
}
