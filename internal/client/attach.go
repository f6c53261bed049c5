package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/wire"
)

const (
	pingEvery    = 20 * time.Second
	pingTimeout  = 15 * time.Second
	writeTimeout = 10 * time.Second
	dialTimeout  = 30 * time.Second
	readLimit    = 64 << 20 // a replay frame carries up to the session's whole ring
	busyRetries  = 5        // 409s tolerated after a drop: the gateway may still hold our old connection
)

// ErrTakenOver: another client attached with takeover; the session is
// theirs now, and Attach does not re-dial (the two would fight).
var ErrTakenOver = errors.New("the session was taken over by another client")

// ErrInterrupted: the interrupt byte was typed while disconnected.
var ErrInterrupted = errors.New("interrupted while reconnecting")

// errSessionGone: the gateway said the session was deleted.
var errSessionGone = errors.New("the session is gone (deleted, or its sandbox removed)")

// Size is a terminal's size in character cells.
type Size struct{ Rows, Cols uint16 }

// EventKind says what an Event reports.
type EventKind int

const (
	// Connected: attached (again); Attempt is how many tries it took.
	Connected EventKind = iota + 1
	// Reconnecting: the connection dropped or could not be made (Err);
	// the next try is in Delay.
	Reconnecting
	// Lost: Bytes of output were gone from the gateway's ring before they
	// could be replayed.
	Lost
	// Notice: the gateway sent an error frame (Err).
	Notice
)

// Event is a change worth telling the user about.
type Event struct {
	Kind    EventKind
	Attempt int
	Delay   time.Duration
	Bytes   int64
	Err     error
}

// AttachOptions configure Attach. Only Output is required.
type AttachOptions struct {
	// Takeover evicts a client that holds the session (first attach only).
	Takeover bool
	// Output receives the session's output: every byte once, in order,
	// across reconnects. Written only from Attach's goroutine.
	Output io.Writer
	// Input is stdin for the session, chunk by chunk. A closed channel just
	// ends input. Input read while disconnected is dropped, except that the
	// Interrupt byte then ends Attach with ErrInterrupted.
	Input <-chan []byte
	// Interrupt is the byte that gives up a reconnect (default 0x03, Ctrl-C).
	Interrupt byte
	// Resize carries terminal size changes.
	Resize <-chan Size
	// Size, if set, is asked for the size to announce after every attach.
	Size func() (Size, bool)
	// Notify, if set, hears about connections and losses; it is called from
	// Attach's goroutine and must not block.
	Notify func(Event)
	// MinBackoff and MaxBackoff bound the delay between tries (defaults
	// 250 ms and 10 s); the delay doubles per failed try, with jitter.
	MinBackoff, MaxBackoff time.Duration
}

// Attach attaches to a session and keeps it attached until its process
// exits, returning the exit code. After a dropped connection (or 1001,
// 1008, a 5xx, a network error) it re-attaches with since = the bytes it
// has delivered, so Output gets nothing twice and nothing is skipped that
// the gateway still retains (a Lost event reports what it no longer did).
//
// It returns ErrTakenOver after close 4001; an *Error for a refusal that
// retrying cannot fix (401, 403, 404, 409 ALREADY_CONNECTED when the first
// attach finds another holder, or a later one still does after a few
// tries); ErrInterrupted; or ctx's error. It blocks;
// the goroutines it starts have ended when it returns.
func (c *Client) Attach(ctx context.Context, sandboxID, sessionID string, o AttachOptions) (int, error) {
	if o.Interrupt == 0 {
		o.Interrupt = 0x03
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 250 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
	if o.Notify == nil {
		o.Notify = func(Event) {}
	}
	a := &attachment{c: c, sbx: sandboxID, sid: sessionID, o: o}
	takeover := o.Takeover
	attempt, busy := 0, 0
	// mayHold: an earlier try of ours may still be held by the gateway
	// (it was attached, or it failed in a way that may have been after the
	// gateway took it, such as a connection cut during the handshake), so
	// a 409 may be our own ghost and is retried a few times.
	mayHold := false
	for {
		r, err := a.once(ctx, takeover)
		switch {
		case r.exited:
			return r.code, nil
		case errors.Is(err, ErrTakenOver), errors.Is(err, errSessionGone):
			return -1, err
		case ctx.Err() != nil:
			return -1, ctx.Err()
		}
		if r.attached {
			attempt, busy = 0, 0
		}
		var refused *Error
		if errors.As(err, &refused) {
			switch {
			case refused.Status == http.StatusConflict && mayHold && busy < busyRetries:
				busy++
			case refused.Status/100 == 4:
				return -1, err
			}
		} else if err != nil {
			mayHold = true
		}
		if err != nil && errors.Is(err, errOutput) {
			return -1, err
		}
		takeover = false
		delay := backoff(attempt, o.MinBackoff, o.MaxBackoff)
		attempt++
		o.Notify(Event{Kind: Reconnecting, Attempt: attempt, Delay: delay, Err: err})
		if err := a.wait(ctx, delay); err != nil {
			return -1, err
		}
	}
}

// backoff is the delay before try n+1: min·2^n capped at max, less up to
// a half of jitter so that many clients do not re-dial in step.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := hi
	if n < 30 && lo<<n < hi {
		d = lo << n
	}
	return d/2 + rand.N(d/2+1)
}

// attachment is the state kept across one Attach's connections.
type attachment struct {
	c        *Client
	sbx, sid string
	o        AttachOptions
	received int64 // absolute offset of the next output byte
}

type result struct {
	attached bool // got the connected frame
	exited   bool
	code     int
}

// errOutput marks a failed write to Output: the local side is gone.
var errOutput = errors.New("write output")

// wait sleeps d, dropping input typed meanwhile, unless ctx ends or the
// interrupt byte is typed.
func (a *attachment) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	in := a.o.Input
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case b, ok := <-in:
			if !ok {
				in = nil
			} else if bytes.IndexByte(b, a.o.Interrupt) >= 0 {
				return ErrInterrupted
			}
		}
	}
}

// once makes one connection and serves it until it ends.
func (a *attachment) once(ctx context.Context, takeover bool) (r result, err error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	conn, res, err := websocket.Dial(dctx, a.c.wsURL(a.sbx, a.sid, a.received, takeover), &websocket.DialOptions{
		HTTPClient: a.c.http,
		HTTPHeader: http.Header{"X-Sandbox-Lease": {a.c.token}},
	})
	cancel()
	if err != nil {
		if res != nil && res.StatusCode != http.StatusSwitchingProtocols {
			return r, problem(res)
		}
		return r, err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(readLimit)

	cctx, stop := context.WithCancelCause(ctx)
	connected := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		a.write(cctx, stop, conn, connected)
	}()
	defer func() {
		stop(nil)
		<-writerDone
	}()

	var gone bool
	var exit *int
	var buf []byte // the last message; reused (conn.Read allocates each)
	for {
		if cap(buf) > keepBuf {
			buf = nil // after a replay of a large ring
		}
		typ, data, err := readMessage(cctx, conn, buf[:0])
		buf = data
		if err != nil {
			switch {
			case exit != nil:
				return result{attached: r.attached, exited: true, code: *exit}, nil
			case websocket.CloseStatus(err) == wire.CloseTakenOver:
				return r, ErrTakenOver
			case gone:
				return r, errSessionGone
			case context.Cause(cctx) != nil && ctx.Err() == nil:
				return r, context.Cause(cctx) // the writer failed: a dead connection
			}
			return r, err
		}
		if typ == websocket.MessageText {
			var m wire.ServerMsg
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			switch m.Type {
			case "connected":
				r.attached = true
				close(connected)
				a.o.Notify(Event{Kind: Connected})
			case "exit":
				code := 0
				if m.ExitCode != nil {
					code = *m.ExitCode
				}
				exit = &code
			case "error":
				if m.Code == wire.CodeSessionGone {
					gone = true
				}
				a.o.Notify(Event{Kind: Notice, Err: fmt.Errorf("%s: %s", m.Code, m.Error)})
			}
			continue
		}
		f, ferr := wire.DecodeServer(data)
		if ferr != nil {
			continue
		}
		switch f.Channel {
		case wire.ChanOutput, wire.ChanStderr:
			err = a.output(a.received, f.Data)
		case wire.ChanReplay:
			err = a.output(f.Offset, f.Data)
		}
		if err != nil {
			return r, fmt.Errorf("%w: %w", errOutput, err)
		}
	}
}

// keepBuf is the largest message buffer an attachment keeps for the next
// message: a live frame's (the gateway sends at most 256 KiB), not a
// replay's.
const keepBuf = 1 << 20

// readMessage reads the next message into buf, grown as it arrives.
func readMessage(ctx context.Context, conn *websocket.Conn, buf []byte) (websocket.MessageType, []byte, error) {
	typ, r, err := conn.Reader(ctx)
	if err != nil {
		return 0, buf, err
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(512, cap(buf)))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return typ, buf, nil
		}
		if err != nil {
			return 0, buf, err
		}
	}
}

// output writes the part of p (whose first byte is at absolute offset
// off) that Output has not had yet.
func (a *attachment) output(off int64, p []byte) error {
	if off > a.received {
		a.o.Notify(Event{Kind: Lost, Bytes: off - a.received})
		a.received = off
	}
	skip := a.received - off
	if skip >= int64(len(p)) {
		return nil
	}
	p = p[skip:]
	a.received += int64(len(p))
	_, err := a.o.Output.Write(p)
	return err
}

// write is a connection's writer: stdin, resizes and keep-alive pings.
// A failed write or ping cancels the connection with the error as cause.
func (a *attachment) write(ctx context.Context, fail context.CancelCauseFunc, conn *websocket.Conn, connected <-chan struct{}) {
	send := func(typ websocket.MessageType, p []byte) bool {
		wctx, cancel := context.WithTimeout(ctx, writeTimeout)
		defer cancel()
		if err := conn.Write(wctx, typ, p); err != nil {
			fail(err)
			return false
		}
		return true
	}
	resize := func(s Size) bool {
		b, _ := json.Marshal(map[string]any{"type": "resize", "rows": s.Rows, "cols": s.Cols})
		return send(websocket.MessageText, b)
	}
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	in := a.o.Input
	var resizes <-chan Size // nil until attached: the announcement covers earlier changes
	for {
		select {
		case <-ctx.Done():
			return
		case <-connected:
			connected = nil
			resizes = a.o.Resize
			if a.o.Size != nil {
				if s, ok := a.o.Size(); ok && !resize(s) {
					return
				}
			}
		case s := <-resizes:
			if !resize(s) {
				return
			}
		case b, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			if !send(websocket.MessageBinary, append([]byte{wire.ChanStdin}, b...)) {
				return
			}
		case <-ping.C:
			pctx, cancel := context.WithTimeout(ctx, pingTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				fail(fmt.Errorf("keep-alive ping: %w", err))
				return
			}
		}
	}
}
