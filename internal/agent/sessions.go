package agent

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/ring"
)

// session is a terminal session the agent holds: the process, its
// retained output with absolute offsets, and its exit status. Its output
// readers append to the ring and wake the subscribers, each of which
// copies what it has not sent yet; they wait only for an attached
// subscriber that falls behind while making progress (see throttle).
type session struct {
	id      string
	spec    providers.ProcessSpec
	created time.Time
	ringMax int
	stall   time.Duration // a subscriber's stallAfter

	mu     sync.Mutex
	cond   *sync.Cond // broadcast on output, exit and removal
	tty    bool
	ring   *ring.Ring
	marks  []chanMark // pipe mode: the offsets where the channel changes
	exited bool
	lost   bool // ended without an exit status
	code   int
	gone   bool              // deleted: subscribers end
	subs   map[*sub]struct{} // the attached subscribers

	proc *process // nil until started
}

// chanMark says the output from off on is on channel ch, until the next
// mark.
type chanMark struct {
	off int64
	ch  byte
}

func (ss *session) info() agentwire.SessionInfo {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.infoLocked()
}

func (ss *session) infoLocked() agentwire.SessionInfo {
	i := agentwire.SessionInfo{
		ID: ss.id, TTY: ss.tty, Started: ss.proc != nil, Running: !ss.exited,
		Lost: ss.lost, OutputOffset: ss.ring.Total(), CreatedAt: ss.created,
	}
	if ss.exited && !ss.lost {
		code := ss.code
		i.ExitCode = &code
	}
	return i
}

// startSession records a session and starts its process unless deferred.
func (s *Server) startSession(ctx context.Context, req agentwire.StartRequest) (agentwire.SessionInfo, error) {
	if req.ID == "" {
		return agentwire.SessionInfo{}, providers.Errorf(providers.ErrInvalid, "a session needs an id")
	}
	ringMax := req.RingBytes
	if ringMax <= 0 {
		ringMax = agentwire.DefaultRing
	}
	ss := &session{
		id: req.ID, spec: req.Spec, created: time.Now().UTC(), ringMax: ringMax, stall: s.stallAfter,
		tty: req.Spec.TTY, ring: ring.New(ringMax),
	}
	ss.cond = sync.NewCond(&ss.mu)
	ss.subs = map[*sub]struct{}{}
	s.mu.Lock()
	if s.sessions[req.ID] != nil {
		s.mu.Unlock()
		return agentwire.SessionInfo{}, providers.Errorf(providers.ErrConflict, "session %s exists", req.ID)
	}
	s.sessions[req.ID] = ss
	s.mu.Unlock()
	if !req.Deferred {
		if err := s.launch(ctx, ss, req.Spec.TTY); err != nil {
			s.mu.Lock()
			delete(s.sessions, req.ID)
			s.mu.Unlock()
			return agentwire.SessionInfo{}, err
		}
	}
	return ss.info(), nil
}

// launch starts ss's process in TTY or pipe mode, once.
func (s *Server) launch(ctx context.Context, ss *session, tty bool) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.proc != nil || ss.gone {
		return nil
	}
	spec := ss.spec
	spec.TTY = tty
	proc, err := s.startProcess(ctx, spec)
	if err != nil {
		return err
	}
	ss.proc, ss.tty = proc, tty
	outs := []io.Reader{proc.Stdout()}
	if e := proc.Stderr(); e != nil && !tty {
		outs = append(outs, e)
	}
	drained := make(chan struct{})
	var readers sync.WaitGroup
	for i, r := range outs {
		ch := agentwire.FrameStdout
		if i == 1 {
			ch = agentwire.FrameStderr
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			ss.read(r, ch, &s.grownPipes)
		}()
	}
	go func() {
		readers.Wait()
		close(drained)
	}()
	go ss.own(drained)
	return nil
}

// read copies one output stream into the ring until EOF or an error. Its
// buffer starts small and doubles, up to maxReadBuf, whenever a read fills
// it: an idle session costs little and a busy one makes few, large reads.
// grown counts the agent's pipes grown for streaming (see growPipe).
func (ss *session) read(r io.Reader, ch byte, grown *atomic.Int32) {
	buf := make([]byte, minReadBuf)
	tried, refused := false, false
	for {
		n, err := r.Read(buf)
		if n > 0 {
			ss.mu.Lock()
			if !ss.tty && (len(ss.marks) == 0 || ss.marks[len(ss.marks)-1].ch != ch) {
				ss.marks = append(ss.marks, chanMark{ss.ring.Total(), ch})
				ss.trimMarks()
			}
			ss.ring.Write(buf[:n])
			ss.cond.Broadcast()
			for x := range ss.subs {
				if x.gathering && ss.ring.Total()-x.cursor >= ss.coalesce() {
					select {
					case x.gathered <- struct{}{}:
					default:
					}
				}
			}
			ss.throttle()
			ss.mu.Unlock()
		}
		if err != nil {
			return
		}
		switch {
		case n == len(buf) && len(buf) < min(maxReadBuf, ss.ringMax/4):
			buf = make([]byte, 2*len(buf))
		case !ss.tty && !refused && n >= minReadBuf && n < len(buf):
			// Pipe output is coming in pieces and the pipe is drained: let
			// it fill for gatherPipe before the next read instead of
			// waking for each of the process's writes (4-8 KiB from most
			// programs), since each read became a frame that woke the
			// gateway and its client too. What was read goes on at once;
			// only what comes during the pause waits, and output in small
			// pieces (a prompt, an echo) never pauses. Once the output
			// streams, the pipe is grown to hold what comes meanwhile; a
			// pipe that cannot grow is read as it comes (paused, its 64 KiB
			// would cap the stream).
			if n >= growRead && !tried {
				tried = true
				if !growPipe(r, grown) {
					refused = true
					continue
				}
				defer grown.Add(-1)
			}
			time.Sleep(gatherPipe)
		}
	}
}

// growPipe grows the pipe r reads from to streamPipe and counts it in
// grown, unless r is not a pipe, maxGrownPipes are grown already, or the
// kernel refuses; it reports whether it did. The caller subtracts it from
// grown when it stops reading. The bound matters to a user without
// CAP_SYS_RESOURCE (a local sandbox's init): once its pipes hold
// /proc/sys/fs/pipe-user-pages-soft (16,384 pages by default) the kernel
// gives each new pipe of that user 2 pages instead of 16.
func growPipe(r io.Reader, grown *atomic.Int32) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	if grown.Add(1) > maxGrownPipes {
		grown.Add(-1)
		return false
	}
	err := control(f, func(fd int) error {
		_, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, streamPipe)
		return err
	})
	if err != nil {
		grown.Add(-1)
		return false
	}
	return true
}

// sub is one subscriber, as the readers see it.
type sub struct {
	cursor    int64        // what it has sent on
	last      atomic.Int64 // unix nanoseconds: when it last sent something (or attached)
	dropped   bool         // stalled: it no longer holds the readers back
	gathering bool         // waiting for more output before it sends
	gathered  chan struct{}
}

// stallAfter is how long a subscriber may make no progress while the
// readers wait for it before they stop waiting (Server.stallAfter).
// Progress is counted every progressChunk sent: a frame can hold a whole
// ring, which a client reading slowly but steadily (one of a hundred
// streams on two cores) takes longer than stallAfter to take.
const (
	stallAfter    = 2 * time.Second
	progressChunk = 256 << 10
)

// send writes frame f to st, progressChunk at a time, noting the
// subscriber's progress after each.
func (me *sub) send(st io.Writer, f []byte) error {
	for len(f) > 0 {
		n := min(len(f), progressChunk)
		if _, err := st.Write(f[:n]); err != nil {
			return err
		}
		me.last.Store(time.Now().UnixNano())
		f = f[n:]
	}
	return nil
}

// throttle holds the reader back while an attached subscriber is more
// than half a ring behind and making progress: a client that reads
// slower than the process writes slows the process, as a terminal does,
// instead of losing output. One that makes no progress for stallAfter is
// dropped from the wait; if it falls a whole ring behind it gets the slow
// frame. Caller holds mu.
func (ss *session) throttle() {
	for {
		var laggard *sub
		for x := range ss.subs {
			if !x.dropped && (laggard == nil || x.cursor < laggard.cursor) {
				laggard = x
			}
		}
		if laggard == nil || ss.ring.Total()-laggard.cursor <= int64(ss.ringMax/2) || ss.gone {
			return
		}
		wait := ss.stall - time.Since(time.Unix(0, laggard.last.Load()))
		if wait <= 0 {
			laggard.dropped = true
			continue
		}
		t := time.AfterFunc(wait, func() {
			ss.mu.Lock()
			ss.cond.Broadcast()
			ss.mu.Unlock()
		})
		ss.cond.Wait()
		t.Stop()
	}
}

// The output readers' buffer sizes; the read after which a pipe is grown,
// to streamPipe, with at most maxGrownPipes grown at once (16 MiB: a
// quarter of an unprivileged user's default soft limit). A grown pipe
// lets a reader pausing gatherPipe keep up with 1 GB/s; measured on the
// bench's pipe scenario, 256 KiB capped it below where it was unpaused.
const (
	minReadBuf    = 4 << 10
	maxReadBuf    = 256 << 10
	growRead      = 32 << 10
	streamPipe    = 1 << 20
	maxGrownPipes = 16
)

// trimMarks drops marks the ring has overwritten, keeping the one in
// force at the ring's start. Caller holds mu.
func (ss *session) trimMarks() {
	start := ss.ring.Start()
	i := 0
	for i+1 < len(ss.marks) && ss.marks[i+1].off <= start {
		i++
	}
	if i > 0 {
		ss.marks = append(ss.marks[:0], ss.marks[i:]...)
	}
}

// own waits for the process, drains its output (bounded: a leftover may
// hold the terminal forever), releases the terminal or pipes and records
// the exit status.
func (ss *session) own(drained chan struct{}) {
	code, werr := ss.proc.Wait()
	t := time.NewTimer(drainGrace)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	ss.proc.Kill()
	<-drained
	ss.mu.Lock()
	ss.exited, ss.code, ss.lost = true, code, werr != nil
	ss.cond.Broadcast()
	ss.mu.Unlock()
}

// started is the process, nil before a deferred session's first attach.
func (ss *session) started() *process {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.proc
}

// kill ends the process and everything it started; the owner then
// records the exit.
func (ss *session) kill() {
	if p := ss.started(); p != nil {
		p.Kill()
	}
}

// segment is output of one channel.
type segment struct {
	ch   byte
	data []byte
}

// since copies the output from cursor on (from the ring's start when the
// ring has overwritten cursor), split where the channel changes. Caller
// holds mu.
func (ss *session) since(cursor int64) ([]segment, int64) {
	total := ss.ring.Total()
	if cursor >= total {
		return nil, total
	}
	data, from := ss.ring.AppendSince(nil, cursor)
	if ss.tty || len(ss.marks) == 0 {
		return []segment{{agentwire.FrameStdout, data}}, total
	}
	var out []segment
	for i, m := range ss.marks {
		end := total
		if i+1 < len(ss.marks) {
			end = ss.marks[i+1].off
		}
		lo, hi := max(m.off, from), end
		if lo >= hi {
			continue
		}
		out = append(out, segment{m.ch, data[lo-from : hi-from]})
	}
	return out, total
}

// attach serves a subscriber on st: the reply with the replay's offset,
// the replay, then live output, and the exit frame when the process has
// exited and its output is sent. A subscriber that falls a whole ring
// behind gets the slow frame and is ended. Frames the gateway sends on st
// (stdin, EOF, resize, signal) are applied as they come; st closing ends
// the subscription.
func (s *Server) attach(st io.ReadWriteCloser, req agentwire.Request) {
	s.mu.Lock()
	ss := s.sessions[req.Session]
	s.mu.Unlock()
	if ss == nil {
		agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrNotFound, "no session %s", req.Session)))
		return
	}
	if ss.started() == nil {
		tty := req.TTY == nil || *req.TTY
		if err := s.launch(context.Background(), ss, tty); err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
	}
	if req.Since < 0 {
		agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "since must be >= 0")))
		return
	}
	ss.mu.Lock()
	since, cursor := req.Since, ss.ring.Total()
	if req.MaxReplay > 0 && cursor-since > req.MaxReplay {
		since = cursor - req.MaxReplay // the gateway takes no more (a ring larger than it asks for now)
	}
	from := max(since, ss.ring.Start())
	replay := []byte(nil)
	if since < cursor {
		replay, from = ss.ring.AppendSince(nil, since)
	}
	info := ss.infoLocked()
	// The subscriber counts from now, while its replay is being sent:
	// the readers wait for it rather than overwrite what it has not
	// sent yet.
	me := &sub{cursor: cursor, gathered: make(chan struct{}, 1)}
	me.last.Store(time.Now().UnixNano())
	ss.subs[me] = struct{}{}
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		delete(ss.subs, me)
		ss.cond.Broadcast()
		ss.mu.Unlock()
	}()
	if agentwire.WriteMsg(st, agentwire.Reply{Replay: from, Session: &info}) != nil || me.send(st, replayFrame(replay)) != nil {
		return
	}
	me.last.Store(time.Now().UnixNano())
	left := make(chan struct{})
	go func() {
		defer close(left)
		ss.input(st)
		ss.mu.Lock()
		ss.cond.Broadcast()
		ss.mu.Unlock()
	}()
	defer func() { st.Close(); <-left }()
	var scratch []byte // the frame buffer, reused while a single frame fits
	var lastSent time.Time
	for {
		ss.mu.Lock()
		for ss.ring.Total() == cursor && !ss.exited && !ss.gone && !closed(left) {
			ss.cond.Wait()
		}
		if pending := ss.ring.Total() - cursor; pending >= bulk && pending < ss.coalesce() && !ss.exited && time.Since(lastSent) < streaming {
			// Output is streaming in chunks (the last frame went out just
			// now): gather more, for gather or until coalesce bytes are
			// pending (the reader says so), so that frames are fewer and
			// larger: each costs a wakeup of the gateway, on cores the
			// process shares. An echo (a few bytes) goes out at once.
			me.gathering = true
			ss.mu.Unlock()
			t := time.NewTimer(ss.gather())
			select {
			case <-me.gathered:
			case <-t.C:
			}
			t.Stop()
			ss.mu.Lock()
			me.gathering = false
		}
		if cursor < ss.ring.Start() {
			// The ring has overwritten what this subscriber has not sent:
			// it cannot go on without a gap. Its client re-attaches with
			// since and gets what is left.
			ss.mu.Unlock()
			agentwire.WriteFrame(st, agentwire.FrameSlow, nil)
			return
		}
		frames, next := ss.frames(cursor, scratch[:0])
		cursor = next
		if len(frames) == 1 && cap(frames[0]) > cap(scratch) {
			scratch = frames[0][:0] // keep the larger buffer for the next copy
		}
		exited, lost, code, gone := ss.exited, ss.lost, ss.code, ss.gone
		ss.mu.Unlock()
		if closed(left) || (gone && !exited) {
			return
		}
		for _, f := range frames {
			if me.send(st, f) != nil {
				return
			}
		}
		if len(frames) > 0 {
			lastSent = time.Now()
			ss.mu.Lock()
			me.cursor, me.dropped = cursor, false
			me.last.Store(lastSent.UnixNano())
			ss.cond.Broadcast()
			ss.mu.Unlock()
		}
		if exited && len(frames) == 0 {
			b, _ := json.Marshal(agentwire.ExitInfo{Code: code, Lost: lost})
			agentwire.WriteFrame(st, agentwire.FrameExit, b)
			return
		}
	}
}

// replayFrame is the replay frame of p.
func replayFrame(p []byte) []byte {
	f := make([]byte, 5, 5+len(p))
	f[0] = agentwire.FrameReplay
	binary.BigEndian.PutUint32(f[1:], uint32(len(p)))
	return append(f, p...)
}

// A subscriber with from bulk to coalesce bytes pending, whose last frame
// went out less than streaming ago, waits up to gather for coalesce bytes
// before it sends. A terminal delivers its output 4 KiB a read, and each
// frame costs a wakeup of the gateway on cores the process shares, so a
// terminal's frames gather more; pipes are read in large pieces anyway.
// Measured with BenchmarkPTYOutput (internal/handlers): 16 KiB and 0.5 ms
// for both gave a PTY-mode ratio of 0.64-0.69; a terminal's 128 KiB and
// 2 ms, 0.70-0.88 (median 0.81).
const (
	bulk         = 1 << 10
	streaming    = 4 * time.Millisecond
	gatherTTY    = 2 * time.Millisecond
	coalescePipe = 16 << 10
	gatherPipe   = 500 * time.Microsecond
)

func (ss *session) coalesce() int64 {
	if ss.tty {
		return agentwire.CoalesceTTY
	}
	return coalescePipe
}

func (ss *session) gather() time.Duration {
	if ss.tty {
		return gatherTTY
	}
	return gatherPipe
}

// frames copies the output from cursor on (from the ring's start when the
// ring has overwritten cursor) into ready-to-write frames, one per
// channel run and at most maxFrame each. Caller holds mu.
func (ss *session) frames(cursor int64, scratch []byte) ([][]byte, int64) {
	total := ss.ring.Total()
	if cursor >= total {
		return nil, total
	}
	var out [][]byte
	typ, oneRun := agentwire.FrameStdout, ss.tty || len(ss.marks) == 0
	if last := len(ss.marks) - 1; !oneRun && ss.marks[last].off <= max(cursor, ss.ring.Start()) {
		oneRun = true // everything from cursor on is of the last channel
		if ss.marks[last].ch == agentwire.FrameStderr {
			typ = agentwire.FrameStderr
		}
	}
	if oneRun {
		for cursor < total {
			n := min(total-cursor, agentwire.MaxFrame)
			f := scratch[:0]
			scratch = nil // only the first frame reuses it
			if int64(cap(f)) < 5+n {
				f = make([]byte, 0, 5+n)
			}
			f, from := ss.ring.AppendSince(f[:5], cursor)
			f = f[:5+min(int64(len(f)-5), n)]
			f[0] = typ
			binary.BigEndian.PutUint32(f[1:5], uint32(len(f)-5))
			out = append(out, f)
			cursor = from + int64(len(f)-5)
		}
		return out, total
	}
	segs, next := ss.since(cursor)
	for _, sg := range segs {
		typ := agentwire.FrameStdout
		if sg.ch == agentwire.FrameStderr {
			typ = agentwire.FrameStderr
		}
		for p := sg.data; len(p) > 0; {
			n := min(len(p), agentwire.MaxFrame)
			f := make([]byte, 5, 5+n)
			f[0] = typ
			binary.BigEndian.PutUint32(f[1:5], uint32(n))
			out = append(out, append(f, p[:n]...))
			p = p[n:]
		}
	}
	return out, next
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// input applies the gateway's frames on an attach until the stream ends.
func (ss *session) input(st io.Reader) {
	var buf []byte
	for {
		typ, p, err := agentwire.ReadFrame(st, buf)
		if err != nil {
			return
		}
		buf = p[:0]
		proc := ss.started()
		switch typ {
		case agentwire.FrameStdin:
			proc.Stdin().Write(p)
		case agentwire.FrameEOF:
			proc.Stdin().Close()
		case agentwire.FrameResize:
			if len(p) == 4 {
				proc.Resize(binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:]))
			}
		case agentwire.FrameSignal:
			if len(p) == 1 {
				proc.Signal(syscall.Signal(p[0]))
			}
		}
	}
}

// deleteSession kills a session's process and forgets it. Its
// subscribers get the exit (137) before their streams end.
func (s *Server) deleteSession(id string) error {
	s.mu.Lock()
	ss := s.sessions[id]
	delete(s.sessions, id)
	s.mu.Unlock()
	if ss == nil {
		return providers.Errorf(providers.ErrNotFound, "no session %s", id)
	}
	ss.kill()
	ss.mu.Lock()
	if ss.proc != nil {
		deadline := time.AfterFunc(10*time.Second, func() {
			ss.mu.Lock()
			ss.gone = true
			ss.cond.Broadcast()
			ss.mu.Unlock()
		})
		for !ss.exited && !ss.gone {
			ss.cond.Wait()
		}
		deadline.Stop()
	}
	ss.gone = true
	ss.cond.Broadcast()
	ss.mu.Unlock()
	return nil
}

func (s *Server) listSessions() []agentwire.SessionInfo {
	s.mu.Lock()
	ss := make([]*session, 0, len(s.sessions))
	for _, x := range s.sessions {
		ss = append(ss, x)
	}
	s.mu.Unlock()
	out := make([]agentwire.SessionInfo, 0, len(ss))
	for _, x := range ss {
		out = append(out, x.info())
	}
	return out
}
