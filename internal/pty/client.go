package pty

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/wire"
)

const (
	// maxLiveFrame caps how much queued output of one channel the writer
	// coalesces into one frame (clients such as Python's websockets refuse
	// messages over 1 MiB by default).
	maxLiveFrame = 256 << 10
	// maxTexts caps the text frames (pongs, errors) waiting to be written:
	// a client that floods pings but never reads is too slow.
	maxTexts = 64
	// keepSpare is the largest queue buffer a client keeps while it has
	// waited releaseAfter for output: a streaming client reuses its two
	// buffers at whatever size the stream needs (growing them anew for
	// each batch cost the gateway a fifth of its CPU in copies and
	// garbage collection), an idle one holds little.
	keepSpare    = 64 << 10
	releaseAfter = time.Second
)

// queue is a client's outgoing output, frame after frame in one buffer:
// each frame starts with its channel byte and ends[i] is where frame i
// ends. Consecutive output of one channel is coalesced into one frame.
type queue struct {
	buf  []byte
	ends []int
}

func (q *queue) push(ch byte, p []byte) {
	if n := len(q.ends); n > 0 {
		start := 0
		if n > 1 {
			start = q.ends[n-2]
		}
		if q.buf[start] == ch && q.ends[n-1]-start+len(p) <= maxLiveFrame {
			q.buf = append(q.buf, p...)
			q.ends[n-1] = len(q.buf)
			return
		}
	}
	q.buf = append(append(q.buf, ch), p...)
	q.ends = append(q.ends, len(q.buf))
}

func (q *queue) reset() {
	q.buf, q.ends = q.buf[:0], q.ends[:0]
}

// client is one attached WebSocket connection. Output reaches it through a
// bounded queue that only its writer goroutine drains; the feeder waits
// while it is full (the host then slows the process to the client's pace)
// and gives up on a client that takes nothing for stallAfter. Every frame,
// and the close, is written by the writer, which makes "close with this
// code" a matter of setting cause.
type client struct {
	m         *Manager
	sandboxID string
	sid       string
	mode      wire.Mode
	att       *agentclient.Attachment // the subscription to the session's output
	holding   bool                    // the session runs and this client holds it (set before serve)
	conn      *websocket.Conn         // set before the writer starts
	lastTouch time.Time               // feeder only: the last activity recorded for the sandbox
	maxQueue  int
	lastSeen  atomic.Int64 // unix nanos of the last frame or pong from the client

	// mu guards the fields below. Lock order: Manager.mu, then client.mu.
	mu     sync.Mutex
	q      queue       // output not yet taken by the writer
	spare  queue       // the writer's recycled buffer
	held   int         // bytes the writer took and has not written yet
	texts  [][]byte    // text frames (pong, error) not yet written
	replay []byte      // the replay frame, written first; nil = none
	exit   *int        // the process exited; all its output is in q
	cause  *closeCause // set once: why the writer closes the connection
	left   bool        // the connection is over: push gives up
	wake   chan struct{}
	room   chan struct{} // the writer took the queue (see push)
}

func newClient(m *Manager, sandboxID, sid string, att *agentclient.Attachment) *client {
	c := &client{m: m, sandboxID: sandboxID, sid: sid, mode: wire.ModePipe, att: att, maxQueue: m.opts.QueueBytes, wake: make(chan struct{}, 1), room: make(chan struct{}, 1)}
	if att.Info.TTY {
		c.mode = wire.ModePTY
	}
	c.lastSeen.Store(time.Now().UnixNano())
	return c
}

func (c *client) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// push queues output, waiting while the queue is full: the session's host
// holds the output meanwhile and slows the process to the client's pace.
// The queue counts what the writer took and has not written yet, so room
// is made frame by frame as the client takes them, and output flows on
// at the client's pace however slow (the session's host sees progress
// too, and keeps the client). A client that takes nothing for stallAfter
// is too slow: it is closed with 1008 (it re-attaches with since). It
// returns false once the connection is closing.
func (c *client) push(ch byte, p []byte) bool {
	var stall *time.Timer
	for {
		c.mu.Lock()
		if c.cause != nil || c.left {
			c.mu.Unlock()
			return false
		}
		if len(c.q.buf) == 0 || c.held+len(c.q.buf)+1+len(p) <= c.maxQueue {
			c.q.push(ch, p)
			c.signal()
			c.mu.Unlock()
			return true
		}
		c.mu.Unlock()
		if stall == nil {
			stall = time.NewTimer(c.m.stallAfter)
			defer stall.Stop()
		}
		select {
		case <-c.room:
			stall.Reset(c.m.stallAfter)
		case <-stall.C:
			c.closeWith(causeSlow)
			return false
		}
	}
}

// stallAfter is how long a client may take nothing while its queue is
// full (Manager.stallAfter).
const stallAfter = 2 * time.Second

// roomMade wakes a push waiting for room in the queue.
func (c *client) roomMade() {
	select {
	case c.room <- struct{}{}:
	default:
	}
}

// sendText queues a text frame (pong, error).
func (c *client) sendText(f []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		return
	}
	if len(c.texts) >= maxTexts {
		c.cause = causeSlow
		c.signal()
		c.roomMade()
		return
	}
	c.texts = append(c.texts, f)
	c.signal()
}

// finish tells c the process exited with code, after all its output was
// pushed: the writer sends the rest of the output, the exit frame, and
// closes with 1000.
func (c *client) finish(code int) {
	c.mu.Lock()
	c.exit = &code
	c.mu.Unlock()
	c.signal()
}

// closeWith makes the writer close the connection with cause, dropping
// the output still queued. The first cause wins. It never blocks.
func (c *client) closeWith(cause *closeCause) {
	c.mu.Lock()
	if c.cause == nil {
		c.cause = cause
		c.q.reset()
	}
	c.mu.Unlock()
	c.signal()
	c.roomMade()
}

// leave marks the connection over: a push waiting for room gives up.
func (c *client) leave() {
	c.mu.Lock()
	c.left = true
	c.mu.Unlock()
	c.roomMade()
}

// write writes one frame with the write timeout. A failed write has
// closed the connection.
func (c *client) write(ctx context.Context, typ websocket.MessageType, p []byte) error {
	ctx, cancel := context.WithTimeout(ctx, c.m.opts.WriteTimeout)
	defer cancel()
	return c.conn.Write(ctx, typ, p)
}

// writeLoop is the connection's only writer: the replay frame, the
// connected frame, then live output and text frames until the process
// exits (exit frame, close 1000), a cause is set (close with its code), a
// write fails, or ctx ends. It returns why it stopped.
func (c *client) writeLoop(ctx context.Context) error {
	if c.replay != nil {
		if err := c.write(ctx, websocket.MessageBinary, c.replay); err != nil {
			return err
		}
		c.replay = nil
	}
	if err := c.write(ctx, websocket.MessageText, wire.ConnectedFrame(c.sid, c.mode)); err != nil {
		return err
	}
	var release *time.Timer // while the queue's buffers are large
	defer func() {
		if release != nil {
			release.Stop()
		}
	}()
	for {
		c.mu.Lock()
		for c.cause == nil && c.exit == nil && len(c.q.ends) == 0 && len(c.texts) == 0 {
			var released <-chan time.Time
			if cap(c.q.buf) > keepSpare || cap(c.spare.buf) > keepSpare {
				if release == nil {
					release = time.NewTimer(c.m.releaseAfter)
				} else {
					release.Reset(c.m.releaseAfter)
				}
				released = release.C
			}
			c.mu.Unlock()
			select {
			case <-c.wake:
			case <-released:
				c.mu.Lock()
				if len(c.q.ends) == 0 {
					c.q = queue{}
				}
				c.spare = queue{}
				c.mu.Unlock()
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			c.mu.Lock()
		}
		if cause := c.cause; cause != nil {
			c.mu.Unlock()
			return c.closeConn(ctx, cause)
		}
		q := c.q
		c.q, c.spare = c.spare, queue{}
		c.held = len(q.buf)
		c.roomMade()
		texts := c.texts
		c.texts = nil
		exit := c.exit
		c.mu.Unlock()

		for _, t := range texts {
			if err := c.write(ctx, websocket.MessageText, t); err != nil {
				return err
			}
		}
		start := 0
		for _, end := range q.ends {
			if err := c.write(ctx, websocket.MessageBinary, q.buf[start:end]); err != nil {
				return err
			}
			c.mu.Lock()
			c.held -= end - start
			c.mu.Unlock()
			c.roomMade()
			start = end
		}
		if exit != nil {
			if err := c.write(ctx, websocket.MessageText, wire.ExitFrame(*exit)); err != nil {
				return err
			}
			return c.closeConn(ctx, causeExited)
		}
		q.reset()
		c.mu.Lock()
		c.spare = q
		c.mu.Unlock()
	}
}

// closeConn sends the error frame of cause, if any, and performs the close
// handshake with its code. The close frame is written before anything can
// cut the connection, so the peer always receives the code.
func (c *client) closeConn(ctx context.Context, cause *closeCause) error {
	c.m.detach(c)
	if cause.errFrame != "" {
		c.write(ctx, websocket.MessageText, wire.ErrorFrame(cause.errFrame, cause.reason))
	}
	c.conn.Close(cause.code, cause.reason)
	return cause
}

// readLoop reads client frames until the connection fails or closes, and
// acts on them. Frames over the limit are discarded and answered with an
// error frame, as are malformed ones; neither ends the connection.
func (c *client) readLoop(ctx context.Context) error {
	limit := c.m.opts.MaxFrame
	// Grown to the largest frame read so far: keystrokes are small, and an
	// idle attachment should not hold MaxFrame bytes (1,000 of them would
	// hold 64 MiB).
	var buf []byte
	for {
		typ, r, err := c.conn.Reader(ctx)
		if err != nil {
			return err
		}
		c.lastSeen.Store(time.Now().UnixNano())
		buf, err = readUpTo(r, buf[:0], limit+1)
		n := len(buf)
		switch {
		case n > limit:
			if _, err := io.Copy(io.Discard, r); err != nil {
				return err
			}
			c.m.met.Refused.WithLabelValues("frame").Inc()
			c.sendText(wire.ErrorFrame(wire.CodeFrameTooLarge, "frame larger than the read limit; discarded"))
			continue
		case err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF):
			return err
		}
		msg, err := wire.DecodeClient(typ == websocket.MessageText, buf[:n])
		if err != nil {
			var fe *wire.FrameError
			errors.As(err, &fe)
			c.sendText(wire.ErrorFrame(fe.Code, fe.Msg))
			continue
		}
		c.handle(msg)
	}
}

// readUpTo appends what r holds to buf, up to limit bytes, growing buf as
// needed; io.EOF is not an error.
func readUpTo(r io.Reader, buf []byte, limit int) ([]byte, error) {
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(limit-len(buf), cap(buf)+512))
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// handle acts on one client frame. Input goes to the session's host on
// the attachment; a full connection back-pressures the client.
func (c *client) handle(msg wire.ClientMsg) {
	var err error
	switch msg.Kind {
	case wire.MsgPing:
		c.sendText(wire.PongFrame)
		return
	case wire.MsgStdin:
		if len(msg.Data) == 0 {
			return
		}
		err = c.att.Input(msg.Data)
		c.m.in.Add(float64(len(msg.Data)))
		c.m.svc.Touch(c.sandboxID)
	case wire.MsgResize:
		if c.mode != wire.ModePTY {
			c.sendText(wire.ErrorFrame(wire.CodeUnsupported, "resize needs a PTY session"))
			return
		}
		err = c.att.Resize(msg.Rows, msg.Cols)
	case wire.MsgSignal:
		err = c.att.Signal(msg.Signal)
	case wire.MsgEOF:
		if c.mode == wire.ModePTY {
			// On a terminal, end of input is the VEOF character (Ctrl-D).
			err = c.att.Input([]byte{0x04})
		} else {
			err = c.att.CloseStdin()
		}
	}
	if err != nil {
		c.sendText(wire.ErrorFrame(wire.CodeInputFailed, "the process did not take it (it may have exited)"))
	}
}

// feed moves the session's live output from the host to the client's
// queue until the process exits (exit frame, close 1000), the host loses
// it (SESSION_GONE), the client falls too far behind (1008: it re-attaches
// with since), or the attachment is closed (the client left).
func (c *client) feed() {
	for {
		ev, err := c.att.Next()
		switch {
		case err != nil:
			c.closeWith(causeGone) // a no-op when the connection is already closing
			return
		case ev.Exited && ev.Lost:
			c.closeWith(causeGone)
			return
		case ev.Slow:
			c.m.detach(c)
			c.closeWith(causeSlow)
			return
		case ev.Exited:
			c.m.detach(c)
			c.finish(ev.Code)
			return
		}
		c.m.out.Add(float64(len(ev.Data)))
		if !c.push(ev.Chan, ev.Data) {
			c.m.detach(c)
			return
		}
		if now := time.Now(); now.Sub(c.lastTouch) >= touchEvery {
			c.lastTouch = now
			c.m.svc.Touch(c.sandboxID)
		}
	}
}

// pingLoop pings every PingInterval and closes the connection with 1008
// when nothing (no frame, no pong) came from the client for IdleTimeout.
func (c *client) pingLoop(ctx context.Context) {
	o := c.m.opts
	t := time.NewTicker(o.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, c.lastSeen.Load())) > o.IdleTimeout {
			c.closeWith(causeSilent)
			return
		}
		pctx, cancel := context.WithTimeout(ctx, o.PingInterval)
		c.conn.Ping(pctx) // the pong (via OnPongReceived) is what counts
		cancel()
	}
}
