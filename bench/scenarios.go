package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	dockerclient "github.com/docker/docker/client"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest/testimage"
)

// bench holds what the scenarios share: the gateway under test, the
// options, and the image a docker sandbox runs.
type bench struct {
	// What sessions' clients were told: bytes gone from the ring before
	// they were replayed, re-attachments.
	lost, reconnects atomic.Int64

	g      *gateway
	o      options
	image  string // docker: the busybox image built for the run
	create map[string]any
}

func (b *bench) sandbox(ctx context.Context) (ref, error) {
	req := map[string]any{}
	for k, v := range b.create {
		req[k] = v
	}
	return b.g.create(ctx, req)
}

// sandboxClient creates a sandbox and a client holding its lease; the
// caller deletes the sandbox.
func (b *bench) sandboxClient(ctx context.Context) (ref, *client.Client, error) {
	sb, err := b.sandbox(ctx)
	if err != nil {
		return ref{}, nil, err
	}
	c, err := client.New(b.g.URL, sb.Tok, b.g.hc)
	if err != nil {
		b.g.delete(ctx, sb)
		return ref{}, nil, err
	}
	return sb, c, nil
}

// timed runs f and returns how long it took, failing the run on error.
func timed(f func() error) (time.Duration, error) {
	t0 := time.Now()
	err := f()
	return time.Since(t0), err
}

// --- 1. exec `true` ---------------------------------------------------------

// execTrue alternates an exec of `true` through the gateway with the
// baseline: on local, /bin/true forked and executed by the host (the
// target's reference; the same command in a fresh set of namespaces
// started directly from Go is measured beside it, in extra); on docker,
// `docker exec`.
func (b *bench) execTrue(ctx context.Context) (Result, error) {
	sb, err := b.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.g.delete(ctx, sb)
	var base func() error
	label := "host /bin/true fork/exec"
	if b.g.provider == "docker" {
		cid, err := dockerRun(ctx, b.image)
		if err != nil {
			return Result{}, err
		}
		defer docker(context.WithoutCancel(ctx), "rm", "-f", cid)
		base = func() error { _, err := docker(ctx, "exec", cid, "true"); return err }
		label = "docker exec"
	} else {
		base = func() error { return exec.Command("/bin/true").Run() }
	}
	var gw, bl, ns []time.Duration
	for range b.o.rounds * b.o.n {
		d, err := timed(func() error { _, err := b.g.exec(ctx, sb, "true"); return err })
		if err != nil {
			return Result{}, err
		}
		gw = append(gw, d)
		if d, err = timed(base); err != nil {
			return Result{}, err
		}
		bl = append(bl, d)
		if b.g.provider == "docker" {
			continue
		}
		if d, err = timed(namespacedTrue); err != nil {
			return Result{}, err
		}
		ns = append(ns, d)
	}
	bs := series(label, millis(bl))
	r := compare("exec true", b.g.provider, "ms", series("gateway", millis(gw)), &bs)
	if b.g.provider != "docker" {
		r.Extra = map[string]float64{"namespaced true p50 ms": series("", millis(ns)).P50}
		r.atMost("≤ 3x host /bin/true", r.Ratio, 3)
	} else {
		r.atMost("p50 ≤ 5 ms", r.Gateway.P50, 5)
	}
	return r, nil
}

// namespacedTrue runs /bin/true in new user, pid, mount, net, uts and ipc
// namespaces as the root of a one-id mapping: what a sandbox's command
// costs the kernel, without a gateway.
func namespacedTrue() error {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 30, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 1 << 30, Size: 1}},
	}
	return cmd.Run()
}

// --- 2. create → first exec → delete ----------------------------------------

// lifecycle times create → first exec → delete, and within it create →
// first exec (the local target: a cold sandbox's first answer).
func (b *bench) lifecycle(ctx context.Context) (Result, error) {
	var gw, bl, first []time.Duration
	for range b.o.rounds * max(b.o.n/10, 2) {
		d, err := timed(func() error {
			t0 := time.Now()
			sb, err := b.sandbox(ctx)
			if err != nil {
				return err
			}
			if _, err := b.g.exec(ctx, sb, "true"); err != nil {
				return err
			}
			first = append(first, time.Since(t0))
			return b.g.delete(ctx, sb)
		})
		if err != nil {
			return Result{}, err
		}
		gw = append(gw, d)
		if b.g.provider != "docker" {
			continue
		}
		if d, err = timed(func() error {
			cid, err := dockerRun(ctx, b.image)
			if err != nil {
				return err
			}
			if _, err := docker(ctx, "exec", cid, "true"); err != nil {
				return err
			}
			_, err = docker(ctx, "rm", "-f", cid)
			return err
		}); err != nil {
			return Result{}, err
		}
		bl = append(bl, d)
	}
	var base *Series
	if len(bl) > 0 {
		s := series("docker run -d + exec + rm -f", millis(bl))
		base = &s
	}
	r := compare("create → exec → delete", b.g.provider, "ms", series("gateway", millis(gw)), base)
	f := series("", millis(first)).P50
	r.Extra = map[string]float64{"create → first exec p50 ms": f}
	if base != nil {
		r.judge("< 1x the CLI", r.Ratio < 1)
	} else {
		r.atMost("create → first exec p50 ≤ 30 ms", f, 30)
	}
	return r, nil
}

// --- 3. PTY output throughput -------------------------------------------------

// outputCmd writes size bytes of 'x' (no newlines: a terminal would
// double them).
func outputCmd(size int) string {
	return fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", size)
}

// throughput reads a session's whole output through the gateway (PTY or
// pipe mode) and, alternately, the same command's output read directly
// from a PTY (or a pipe) on the host.
func (b *bench) throughput(ctx context.Context, ptyMode bool) (Result, error) {
	sb, err := b.sandbox(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.g.delete(ctx, sb)
	size := b.o.streamBytes
	var gw, bl []float64
	var gwCPU time.Duration // the gateway's, over the rounds through it
	for range b.o.rounds {
		cpu0, _ := b.g.usage()
		n, d, err := b.session(ctx, sb, outputCmd(size), ptyMode)
		if err != nil {
			return Result{}, err
		}
		if n != int64(size) {
			return Result{}, fmt.Errorf("session output %d bytes, want %d", n, size)
		}
		cpu, _ := b.g.usage()
		gwCPU += cpu - cpu0
		gw = append(gw, mbps(n, d))
		n, d, err = direct(b.hostShell(), outputCmd(size), ptyMode)
		if err != nil {
			return Result{}, err
		}
		bl = append(bl, mbps(n, d))
	}
	mode, label := "pipe", "the same command's pipe, read directly"
	if ptyMode {
		mode, label = "PTY", "the same command's PTY, read directly"
	}
	bs := series(label, bl)
	r := compare(mode+" output throughput", b.g.provider, "MB/s", series("gateway", gw), &bs)
	// CPU per byte moves less with other load on the machine than the
	// rate does (in clock ticks: only over many MB does it say much).
	r.Extra = map[string]float64{"gateway CPU ms/MB": float64(gwCPU.Milliseconds()) / (float64(size) * float64(b.o.rounds) / 1e6)}
	// Issue 24's bounds: docker's bytes cross three more processes.
	bound := map[[2]bool]float64{{true, false}: 0.9, {true, true}: 0.8, {false, false}: 0.7, {false, true}: 0.5}[[2]bool{ptyMode, b.g.provider == "docker"}]
	r.atLeast(fmt.Sprintf("≥ %gx direct", bound), r.Ratio, bound)
	return r, nil
}

func mbps(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

// countWriter counts the 'x' bytes written to it (the payload of
// outputCmd; not a terminal's echo of the go-ahead).
type countWriter struct{ n atomic.Int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(bytes.Count(p, []byte("x"))))
	return len(p), nil
}

// session starts command as a terminal session, attaches, lets it start
// (it waits for a line: output written before the attach could be
// beyond the retained ring by then) and reads all its output through
// the gateway; it returns the payload bytes and the time from the
// go-ahead to the exit.
func (b *bench) session(ctx context.Context, sb ref, command string, ptyMode bool) (int64, time.Duration, error) {
	c, err := client.New(b.g.URL, sb.Tok, b.g.hc)
	if err != nil {
		return 0, 0, err
	}
	command = "read go; " + command
	id, err := c.CreateSession(ctx, sb.ID, api.PtyCreateRequest{Command: &command, Pty: &ptyMode})
	if err != nil {
		return 0, 0, err
	}
	var out countWriter
	in := make(chan []byte, 1)
	var t0 time.Time
	var once sync.Once
	notify := func(e client.Event) {
		switch e.Kind {
		case client.Connected:
			once.Do(func() { t0 = time.Now(); in <- []byte("\n") })
		case client.Lost:
			b.lost.Add(e.Bytes)
		case client.Reconnecting:
			b.reconnects.Add(1)
		}
	}
	if _, err := c.Attach(ctx, sb.ID, id, client.AttachOptions{Output: &out, Input: in, Notify: notify}); err != nil {
		return 0, 0, err
	}
	return out.n.Load(), time.Since(t0), nil
}

// hostShell is the shell a baseline runs its command with on the host, so
// that it runs the programs the sandbox runs: a local sandbox sees the
// host's own; a docker sandbox runs the test image's busybox applets,
// which are the host's static busybox (busybox's sh prefers its applets),
// and busybox's tr alone is 2-3x slower than GNU's.
func (b *bench) hostShell() []string {
	if b.g.provider == "docker" {
		return []string{testimage.Busybox, "sh", "-c"}
	}
	return []string{"/bin/sh", "-c"}
}

// direct runs command with shell on the host and reads its output from a
// PTY or a pipe.
func direct(shell []string, command string, ptyMode bool) (int64, time.Duration, error) {
	cmd := exec.Command(shell[0], append(shell[1:], command)...)
	t0 := time.Now()
	var r io.Reader
	if ptyMode {
		f, err := pty.Start(cmd)
		if err != nil {
			return 0, 0, err
		}
		defer f.Close()
		r = f
	} else {
		p, err := cmd.StdoutPipe()
		if err != nil {
			return 0, 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, 0, err
		}
		r = p
	}
	n, _ := io.Copy(io.Discard, r) // a PTY ends in EIO once the command exits
	err := cmd.Wait()
	return n, time.Since(t0), err
}

// --- 4. keystroke echo ------------------------------------------------------

// Keystroke echo has two commands, each typed into through the gateway
// and, alternately, on a PTY of the host. The judged one is a program
// that echoes what it reads: the terminal's own echo off, every key
// written back by the program, as a shell at its prompt (readline) or an
// editor does, so one process wakes per key on either side. The other
// leaves the echo to the kernel's line discipline (no process wakes on
// the host at all: the best case a PTY has, 5-80 µs here); it is
// reported beside the judged one, in extra, as it was measured before.
const (
	echoByProgram = "stty raw -echo; exec cat"
	echoByKernel  = "stty -icanon; exec cat >/dev/null"
)

// echoWriter signals every byte the terminal sends back.
type echoWriter struct{ got chan byte }

func (e *echoWriter) Write(p []byte) (int, error) {
	for _, c := range p {
		e.got <- c
	}
	return len(p), nil
}

// typeKey sends one key and times its echo.
func typeKey(send func([]byte) error, recv func() (byte, error)) (time.Duration, error) {
	t0 := time.Now()
	if err := send([]byte("k")); err != nil {
		return 0, err
	}
	for {
		c, err := recv()
		if err != nil {
			return 0, err
		}
		if c == 'k' {
			return time.Since(t0), nil
		}
	}
}

// echoPair starts command in a terminal session of sandbox sb and on a
// PTY of the host, each once it printed echoReady (its terminal set up:
// a key typed before would be echoed twice); it returns a key's round
// trip through each. stop ends both.
func echoPair(ctx context.Context, c *client.Client, sb ref, shell []string, command string) (viaGateway, onHost func() (time.Duration, error), stop func(), err error) {
	command = strings.Replace(command, "; exec", "; echo "+echoReady+"; exec", 1)
	yes := true
	id, err := c.CreateSession(ctx, sb.ID, api.PtyCreateRequest{Command: &command, Pty: &yes})
	if err != nil {
		return nil, nil, nil, err
	}
	host := exec.Command(shell[0], append(shell[1:], command)...)
	f, err := pty.Start(host)
	if err != nil {
		return nil, nil, nil, err
	}
	in := make(chan []byte)
	out := &echoWriter{got: make(chan byte, 1<<16)}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.Attach(actx, sb.ID, id, client.AttachOptions{Output: out, Input: in})
	}()
	stop = func() {
		cancel()
		wg.Wait()
		f.Close()
		host.Process.Kill()
		host.Wait()
	}
	fromGateway := func() (byte, error) {
		select {
		case c := <-out.got:
			return c, nil
		case <-time.After(10 * time.Second):
			return 0, errors.New("no echo through the gateway in 10 s")
		}
	}
	buf := make([]byte, 1)
	fromHost := func() (byte, error) { _, err := f.Read(buf); return buf[0], err }
	for _, recv := range []func() (byte, error){fromGateway, fromHost} {
		if err := awaitReady(recv); err != nil {
			stop()
			return nil, nil, nil, fmt.Errorf("%q: %w", command, err)
		}
	}
	viaGateway = func() (time.Duration, error) {
		return typeKey(func(p []byte) error {
			select {
			case in <- p:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, fromGateway)
	}
	onHost = func() (time.Duration, error) {
		return typeKey(func(p []byte) error { _, err := f.Write(p); return err }, fromHost)
	}
	return viaGateway, onHost, stop, nil
}

// echoReady is what an echo command prints once its terminal is set up.
const echoReady = "READY"

// awaitReady reads until echoReady went by.
func awaitReady(recv func() (byte, error)) error {
	var seen []byte
	for !bytes.HasSuffix(seen, []byte(echoReady)) {
		c, err := recv()
		if err != nil {
			return err
		}
		seen = append(seen, c)
	}
	return nil
}

// echo times keystroke echo (see echoByProgram), through the gateway and
// on a PTY of the host alternately, for both commands in the same rounds.
func (b *bench) echo(ctx context.Context) (Result, error) {
	sb, c, err := b.sandboxClient(ctx)
	if err != nil {
		return Result{}, err
	}
	defer b.g.delete(ctx, sb)
	var samples [4][]time.Duration // program: gateway, host; kernel: gateway, host
	var steps []func() (time.Duration, error)
	for _, command := range []string{echoByProgram, echoByKernel} {
		gw, host, stop, err := echoPair(ctx, c, sb, b.hostShell(), command)
		if err != nil {
			return Result{}, err
		}
		defer stop()
		steps = append(steps, gw, host)
	}
	for range 3 { // warm-up
		for _, step := range steps {
			if _, err := step(); err != nil {
				return Result{}, err
			}
		}
	}
	for range b.o.rounds * b.o.n {
		for i, step := range steps {
			d, err := step()
			if err != nil {
				return Result{}, err
			}
			samples[i] = append(samples[i], d)
		}
	}
	bs := series("a PTY of the host, the same program echoing", millis(samples[1]))
	r := compare("keystroke echo", b.g.provider, "ms", series("gateway", millis(samples[0])), &bs)
	kgw, khost := series("", millis(samples[2])), series("", millis(samples[3]))
	r.Extra = map[string]float64{
		"kernel echo: gateway p50 ms":     kgw.P50,
		"kernel echo: host PTY p50 ms":    khost.P50,
		"kernel echo: gateway ÷ host PTY": kgw.P50 / khost.P50,
	}
	bound := 2.5 // issue 24: the agent hop made SPEC §11's 0.09 ms unreachable
	if b.g.provider == "docker" {
		bound = 3
	}
	r.atMost(fmt.Sprintf("p50 ≤ %gx a host PTY", bound), r.Ratio, bound)
	return r, nil
}

// --- 5. concurrency -----------------------------------------------------------

// concurrentExecs runs waves of execs at once over a few sandboxes and
// reports each exec's latency, each wave's wall time and how many failed:
// a failed exec is counted (and the first one named), not the end of the
// run, so the row can say the target was missed.
func (b *bench) concurrentExecs(ctx context.Context) (Result, error) {
	const boxes = 10
	sbs := make([]ref, boxes)
	for i := range sbs {
		var err error
		if sbs[i], err = b.sandbox(ctx); err != nil {
			return Result{}, err
		}
		defer b.g.delete(ctx, sbs[i])
	}
	var (
		mu       sync.Mutex
		lat      []time.Duration
		walls    []float64
		failed   int
		firstErr error
	)
	for range b.o.rounds {
		var wg sync.WaitGroup
		t0 := time.Now()
		for i := range b.o.concurrency {
			wg.Go(func() {
				d, err := timed(func() error { _, err := b.g.exec(ctx, sbs[i%boxes], "true"); return err })
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					failed++
					if firstErr == nil {
						firstErr = err
					}
					return
				}
				lat = append(lat, d)
			})
		}
		wg.Wait()
		walls = append(walls, float64(time.Since(t0))/float64(time.Millisecond))
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
	}
	r := compare(fmt.Sprintf("%d concurrent execs", b.o.concurrency), b.g.provider, "ms", series("gateway", millis(lat)), nil)
	r.Extra = map[string]float64{"wave wall p50 ms": series("", walls).P50, "errors": float64(failed)}
	if firstErr != nil {
		r.Note = "first error: " + firstErr.Error()
	}
	r.judge("no errors", failed == 0)
	return r, nil
}

// idleSessions holds many attached terminal sessions, idle after a
// screenful of output each, and reports what they cost the gateway:
// resident memory and Go heap, before and with them.
func (b *bench) idleSessions(ctx context.Context) (Result, error) {
	const perBox = 250
	n := b.o.idleSessions
	rss0, heap0 := b.g.status("VmRSS"), b.g.metric(ctx, "go_memstats_heap_inuse_bytes")
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var attached atomic.Int64
	var sb ref
	var c *client.Client
	// Each printed a screenful or so (14 KB) before going idle.
	sleep, yes := "seq 3000; exec sleep 3600", true
	for i := range n {
		if i%perBox == 0 {
			var err error
			if sb, err = b.sandbox(ctx); err != nil {
				return Result{}, err
			}
			defer b.g.delete(context.WithoutCancel(ctx), sb)
			if c, err = client.New(b.g.URL, sb.Tok, b.g.hc); err != nil {
				return Result{}, err
			}
		}
		id, err := c.CreateSession(ctx, sb.ID, api.PtyCreateRequest{Command: &sleep, Pty: &yes})
		if err != nil {
			return Result{}, fmt.Errorf("session %d: %w", i, err)
		}
		wg.Add(1)
		go func(c *client.Client, box string) {
			defer wg.Done()
			c.Attach(actx, box, id, client.AttachOptions{Output: io.Discard, Notify: func(e client.Event) {
				if e.Kind == client.Connected {
					attached.Add(1)
				}
			}})
		}(c, sb.ID)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for attached.Load() < int64(n) {
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("%d of %d sessions attached after 2 minutes", attached.Load(), n)
		}
		select {
		case <-ctx.Done():
			return Result{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	rss, heap, live := b.g.status("VmRSS"), b.g.metric(ctx, "go_memstats_heap_inuse_bytes"), b.g.metric(ctx, "go_gc_heap_live_bytes")
	r := Result{Scenario: fmt.Sprintf("%d idle attached PTY sessions", n), Provider: b.g.provider, Unit: "MiB",
		Gateway: series("gateway RSS", []float64{float64(rss) / (1 << 20)}),
		Extra: map[string]float64{
			"RSS before MiB":      float64(rss0) / (1 << 20),
			"heap before MiB":     heap0 / (1 << 20),
			"heap with MiB":       heap / (1 << 20),
			"live heap MiB":       live / (1 << 20), // as of the last GC
			"RSS per session KiB": float64(rss-rss0) / 1024 / float64(n),
		}}
	r.judge("heap < 100 MiB", heap < 100<<20)
	return r, nil
}

// streaming runs many sessions that each write a quarter of streamBytes
// (at most 8 MiB) at once and reports their aggregate throughput.
func (b *bench) streaming(ctx context.Context) (Result, error) {
	n, size := b.o.streams, min(b.o.streamBytes/4, 8<<20)
	const perBox = 25
	var boxes []ref
	for range (n + perBox - 1) / perBox {
		sb, err := b.sandbox(ctx)
		if err != nil {
			return Result{}, err
		}
		defer b.g.delete(ctx, sb)
		boxes = append(boxes, sb)
	}
	var agg []float64
	var short atomic.Int64
	b.lost.Store(0)
	b.reconnects.Store(0)
	for range b.o.rounds {
		var total atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, n)
		t0 := time.Now()
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got, _, err := b.session(ctx, boxes[i/perBox], outputCmd(size), true)
				if err != nil {
					errs <- err
				}
				if got != int64(size) {
					short.Add(1)
				}
				total.Add(got)
			}()
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return Result{}, err
		}
		agg = append(agg, mbps(total.Load(), time.Since(t0)))
	}
	r := compare(fmt.Sprintf("%d sessions streaming at once (aggregate)", n), b.g.provider, "MB/s", series("gateway", agg), nil)
	// A client that takes nothing for 2 s (starved here: 100 readers, 100
	// writers and the gateway on the same cores) is closed with 1008 and
	// re-attaches; what the process wrote meanwhile beyond the ring is
	// reported lost to it.
	r.Extra = map[string]float64{"re-attachments": float64(b.reconnects.Load()), "MiB lost": float64(b.lost.Load()) / (1 << 20), "streams short": float64(short.Load())}
	r.judge("no output lost", b.lost.Load() == 0)
	return r, nil
}

// --- 6. file transfer ---------------------------------------------------------

// files uploads and downloads fileBytes through the streaming routes
// and, alternately, copies the same file on the host (local) or with
// `docker cp` (docker).
func (b *bench) files(ctx context.Context) ([]Result, error) {
	sb, err := b.sandbox(ctx)
	if err != nil {
		return nil, err
	}
	defer b.g.delete(ctx, sb)
	src, err := os.CreateTemp("", "sandgate-bench-file-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(src.Name())
	if _, err := io.CopyN(src, zeroReader{}, b.o.fileBytes); err != nil {
		return nil, err
	}
	src.Close()
	tmp, err := os.MkdirTemp("", "sandgate-bench-copy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var cid string
	if b.g.provider == "docker" {
		if cid, err = dockerRun(ctx, b.image); err != nil {
			return nil, err
		}
		defer docker(context.WithoutCancel(ctx), "rm", "-f", cid)
	}
	var up, down, bup, bdown []float64
	n := b.o.fileBytes
	for range max(b.o.rounds/2, 2) {
		f, err := os.Open(src.Name())
		if err != nil {
			return nil, err
		}
		d, err := timed(func() error { return b.g.upload(ctx, sb, "/tmp/big", f) })
		f.Close()
		if err != nil {
			return nil, err
		}
		up = append(up, mbps(n, d))
		if d, err = timed(func() error {
			got, err := b.g.download(ctx, sb, "/tmp/big", io.Discard)
			if err == nil && got != n {
				err = fmt.Errorf("downloaded %d bytes, want %d", got, n)
			}
			return err
		}); err != nil {
			return nil, err
		}
		down = append(down, mbps(n, d))
		if cid != "" {
			if d, err = timed(func() error { _, err := docker(ctx, "cp", src.Name(), cid+":/tmp/big"); return err }); err != nil {
				return nil, err
			}
			bup = append(bup, mbps(n, d))
			if d, err = timed(func() error { _, err := docker(ctx, "cp", cid+":/tmp/big", tmp+"/back"); return err }); err != nil {
				return nil, err
			}
			bdown = append(bdown, mbps(n, d))
			os.Remove(tmp + "/back")
		} else {
			if d, err = timed(func() error { return copyFile(src.Name(), tmp+"/copy") }); err != nil {
				return nil, err
			}
			bup = append(bup, mbps(n, d))
			if d, err = timed(func() error { return copyFile(tmp+"/copy", tmp+"/back") }); err != nil {
				return nil, err
			}
			bdown = append(bdown, mbps(n, d))
			os.Remove(tmp + "/copy")
			os.Remove(tmp + "/back")
		}
	}
	label := "a file copy on the host"
	if cid != "" {
		label = "docker cp"
	}
	size := fmt.Sprintf("%d MiB", n>>20)
	bu, bd := series(label, bup), series(label, bdown)
	return []Result{
		compare("upload "+size, b.g.provider, "MB/s", series("gateway", up), &bu),
		compare("download "+size, b.g.provider, "MB/s", series("gateway", down), &bd),
	}, nil
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// copyFile copies src to dst through user space, as a client would.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(struct{ io.Writer }{out}, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// --- docker ------------------------------------------------------------------

func docker(ctx context.Context, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func dockerRun(ctx context.Context, image string) (string, error) {
	return docker(ctx, "run", "-d", "--network", "none", image, "sh", "-c", "while :; do sleep 3600; done")
}

// benchImage builds the busybox image docker sandboxes run, the docker
// tests' own.
func benchImage(ctx context.Context) (string, error) {
	cli, err := dockerclient.NewClientWithOpts(dockerclient.FromEnv, dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		return "", err
	}
	defer cli.Close()
	return testimage.Ref, testimage.Ensure(ctx, cli)
}
