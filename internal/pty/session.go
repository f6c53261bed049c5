// Package pty runs terminal sessions: a process started in a sandbox with a
// PTY (or pipes) whose output is retained in a ring with absolute offsets,
// attached to by at most one WebSocket client at a time, which can drop and
// come back to replay exactly what it missed (SPEC §7, OpenSandbox execd
// compatible).
//
// The pieces: Session (the process, its reader goroutines, the ring and
// the attached client under one lock), client (one WebSocket connection: a
// bounded outgoing queue, a writer, a pinger), Manager (the sessions of
// every sandbox, the attach protocol, and the join point of every
// goroutine), and the close causes (close.go). The protocol itself (frame
// codec, close codes, the retained ring) is package wire, which clients
// share.
package pty

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/wire"
)

// state is a session's lifecycle. It only moves forward:
// running -> exited -> gone, or running -> gone.
type state int

const (
	stateRunning state = iota // the process runs; output is retained
	stateExited               // the process exited; exitCode is set and the output complete
	stateGone                 // deleted, or its sandbox removed: no attach; the manager forgot it
)

// Each output reader's buffer starts at minReadBuf and doubles, up to
// maxReadBuf, whenever a read fills it: an idle session costs little and
// a busy one makes few, large reads.
const (
	minReadBuf = 4 << 10
	maxReadBuf = 256 << 10
)

// touchEvery rate-limits the sandbox activity that output records.
const touchEvery = time.Second

// Info describes a session (GET /pty/{sid}).
type Info struct {
	ID           string
	Running      bool
	OutputOffset int64 // total output so far: the next byte's absolute offset
	ExitCode     *int  // nil while running
	Mode         wire.Mode
	Attached     bool
	CreatedAt    time.Time
}

// Session is one process with retained output. Its reader goroutines feed
// the ring and the attached client; its owner goroutine (run) waits for
// the process and is the only one to tear it down. Delete, sandbox removal
// and shutdown only move the state to gone and kill the process; run then
// finishes the teardown.
type Session struct {
	id        string
	sandboxID string
	mode      wire.Mode
	created   time.Time
	proc      providers.Process
	m         *Manager

	// mu guards ring, holder, state and exitCode: taking the replay
	// snapshot and subscribing happen under it at once, so no byte is lost
	// or sent twice at the seam. It is never held across a network write
	// (pushing to a client only appends to its queue).
	mu       sync.Mutex
	ring     *wire.Ring
	holder   *client // the attached client; nil when nobody is attached
	state    state
	exitCode int

	readers   atomic.Int32  // output readers still running
	drained   chan struct{} // closed when the last reader returns
	done      chan struct{} // closed when run has torn the session down
	lastTouch atomic.Int64  // unix nanos of the last activity recorded for the sandbox
}

// start starts the readers and the owner. The caller has added
// s.goroutines() to m.wg.
func (s *Session) start() {
	streams := s.streams()
	s.readers.Store(int32(len(streams)))
	for _, st := range streams {
		go s.read(st.r, st.ch)
	}
	go s.run()
}

type stream struct {
	r  io.Reader
	ch byte
}

// streams are the output streams to read: stdout, and stderr in pipe mode
// or while the mode is not known yet (a deferred process: its stderr is
// at EOF if it starts with a PTY).
func (s *Session) streams() []stream {
	out := []stream{{s.proc.Stdout(), wire.ChanOutput}}
	_, deferred := s.proc.(*deferred)
	if s.mode == wire.ModePipe || deferred {
		if e := s.proc.Stderr(); e != nil {
			out = append(out, stream{e, wire.ChanStderr})
		}
	}
	return out
}

// goroutines is how many goroutines start starts: the readers and the
// owner.
func (s *Session) goroutines() int { return len(s.streams()) + 1 }

// setMode records the mode a deferred process started in, before any
// client sees the session.
func (s *Session) setMode(mode wire.Mode) {
	s.mu.Lock()
	s.mode = mode
	s.mu.Unlock()
}

// read copies one output stream into the ring and to the attached client
// until EOF or an error (EIO from a PTY master whose slave is gone, or
// the stream closed by Kill).
func (s *Session) read(r io.Reader, ch byte) {
	defer s.m.wg.Done()
	defer func() {
		if s.readers.Add(-1) == 0 {
			close(s.drained)
		}
	}()
	buf := make([]byte, minReadBuf)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			s.output(ch, buf[:n])
		}
		if err != nil {
			return
		}
		if n == len(buf) && len(buf) < maxReadBuf {
			buf = make([]byte, 2*len(buf))
		}
	}
}

// output retains p and queues it for the attached client. A client whose
// queue is full is detached and closed with 1008: the process and the ring
// never wait for a client.
func (s *Session) output(ch byte, p []byte) {
	s.m.out.Add(float64(len(p)))
	s.mu.Lock()
	s.ring.Write(p)
	if h := s.holder; h != nil && !h.push(ch, p) {
		s.holder = nil
	}
	s.mu.Unlock()
	s.touch()
}

// touch records sandbox activity, at most once per touchEvery.
func (s *Session) touch() {
	now := time.Now().UnixNano()
	last := s.lastTouch.Load()
	if now-last < int64(touchEvery) || !s.lastTouch.CompareAndSwap(last, now) {
		return
	}
	s.m.svc.Touch(s.sandboxID)
}

// run is the session's owner: it waits for the process, drains its output,
// releases the terminal or pipes, records the exit code and sends the
// attached client the exit frame (unless the session is already gone, or
// the process was lost with no exit status: exit code -1, and the client
// gets SESSION_GONE and 1001).
func (s *Session) run() {
	defer s.m.wg.Done()
	defer s.m.sessionDone()
	defer close(s.done)
	code, err := s.proc.Wait()
	lost := err != nil
	if lost {
		// No exit status: the sandbox (and with it the process) is gone,
		// or its agent failed. Clients hear SESSION_GONE, not an exit.
		s.m.log.Debug("terminal session: process lost", "sandbox", s.sandboxID, "session", s.id, "err", err)
		code = -1
	}
	// What the process wrote just before it exited may still be in the
	// terminal or the pipes; something it left behind may hold them open
	// forever, so the drain is bounded.
	t := time.NewTimer(s.m.opts.DrainGrace)
	select {
	case <-s.drained:
	case <-t.C:
	}
	t.Stop()
	if err := s.proc.Kill(); err != nil {
		s.m.log.Debug("terminal session: release", "sandbox", s.sandboxID, "session", s.id, "err", err)
	}
	<-s.drained

	s.mu.Lock()
	s.exitCode = code
	var h *client
	if s.state == stateRunning {
		s.state = stateExited
		h, s.holder = s.holder, nil
	}
	s.mu.Unlock()
	switch {
	case h == nil:
	case lost:
		h.closeWith(causeGone)
	default:
		h.finish(code)
	}
}

// end moves the session to gone (it is being deleted, its sandbox was
// removed, or the gateway is shutting down), closes the attached client
// with cause and kills the process. It does not wait: run finishes the
// teardown and closes done.
func (s *Session) end(cause *closeCause) {
	s.mu.Lock()
	s.state = stateGone
	h := s.holder
	s.holder = nil
	s.mu.Unlock()
	if h != nil {
		h.closeWith(cause)
	}
	if err := s.proc.Kill(); err != nil {
		s.m.log.Debug("terminal session: kill", "sandbox", s.sandboxID, "session", s.id, "err", err)
	}
}

// attach makes c the session's client and fills its replay from since, at
// once under the lock. A running session with a holder refuses without
// takeover (ALREADY_CONNECTED) and otherwise evicts it with 4001. A
// session that exited gives c its replay and exit code; c does not hold it.
func (s *Session) attach(c *client, since int64, takeover bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case stateGone:
		return errSessionNotFound(s.id)
	case stateRunning:
		if old := s.holder; old != nil {
			if !takeover {
				return errAlreadyConnected(s.id)
			}
			old.closeWith(causeTakenOver)
		}
		s.holder = c
	case stateExited:
		code := s.exitCode
		c.exit = &code
	}
	if since < s.ring.Total() {
		c.replay = make([]byte, 0, wire.ReplayHeader+int(s.ring.Total()-max(since, s.ring.Start())))
		c.replay = append(c.replay, wire.ChanReplay, 0, 0, 0, 0, 0, 0, 0, 0)
		var off int64
		c.replay, off = s.ring.AppendSince(c.replay, since)
		wire.AppendReplay(c.replay[:0], off, nil) // fill in the header
	}
	return nil
}

// detach forgets c if it still holds the session.
func (s *Session) detach(c *client) {
	s.mu.Lock()
	if s.holder == c {
		s.holder = nil
	}
	s.mu.Unlock()
}

// Info describes the session now.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := Info{
		ID:           s.id,
		Running:      s.state == stateRunning,
		OutputOffset: s.ring.Total(),
		Mode:         s.mode,
		Attached:     s.holder != nil,
		CreatedAt:    s.created,
	}
	if s.state == stateExited {
		code := s.exitCode
		i.ExitCode = &code
	}
	return i
}
