package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// Durable commands. Every command the agent runs (a one-shot exec too) is
// a command: its process tree, its output kept in two spools (complete up
// to the command's cap: the first memSpool bytes of each stream in
// memory, the rest in an unlinked file on the sandbox's own disk) and,
// once it ended, its result. A command started with an id is held under
// it, watched and read by offset from any connection, until its
// retention after the end passes or it is deleted; it outlives the
// connection, and the gateway, that started it.

// Limits of durable commands.
const (
	// memSpool is how much of each stream is kept in memory before the
	// rest spills to disk.
	memSpool = 64 << 10
	// MaxCommands is how many durable commands an agent holds: past it,
	// the oldest ended one is forgotten to make room, and a start with
	// every one still running is refused.
	MaxCommands = 1024
	// DefaultRetain is how long an ended command is held when its start
	// did not say.
	DefaultRetain = time.Hour
	// deliveredRetain bounds the retention of an exec's command once its
	// result reached the gateway: long enough to fetch it again by id
	// should the gateway's own client have lost it.
	deliveredRetain = time.Minute
)

// spool is one output stream of a command. Its single writer appends; any
// number of readers read below size. Guarded by its command's mu.
type spool struct {
	mem       []byte
	f         *os.File // past memSpool; nil until needed
	size      int64
	max       int64 // the cap
	truncated bool
}

// readAt reads from offset off, below the size. Readers call it on a
// copy taken under the command's lock: the bytes below that copy's size
// never change.
func (sp spool) readAt(p []byte, off int64) (int, error) {
	if off < int64(len(sp.mem)) {
		return copy(p, sp.mem[off:]), nil
	}
	if sp.f == nil {
		return 0, io.ErrUnexpectedEOF
	}
	return sp.f.ReadAt(p, off-memSpool)
}

// command is one command the agent runs.
type command struct {
	s       *Server
	id      string // "" for an exec that is not durable
	text    string
	started time.Time
	retain  time.Duration
	seq     int64 // the order of its start among the held commands
	pid     int
	marker  string

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on output and at the end
	out     [2]spool
	ended   bool // the result is final and nothing more is kept
	res     agentwire.ExecResult
	endedAt time.Time
	forget  *time.Timer

	kill     chan struct{} // closed to kill the tree (delete, a cancelled exec)
	killOnce sync.Once
	done     chan struct{} // closed once ended
}

// startCommand starts req as a command; with req.ID it is held (see
// MaxCommands). The error is the start's: the command is not kept.
func (s *Server) startCommand(req agentwire.ExecRequest) (*command, error) {
	if req.MaxOutput <= 0 {
		req.MaxOutput = providers.DefaultMaxOutput
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = providers.DefaultExecTimeout
	}
	argv, err := shellArgs(req.Command)
	if err != nil {
		return nil, err
	}
	cmd, err := s.command(argv, req.User, req.Cwd, req.Env)
	if err != nil {
		return nil, err
	}
	c := &command{s: s, id: req.ID, text: req.Command, retain: time.Duration(req.RetainMS) * time.Millisecond,
		changed: make(chan struct{}), kill: make(chan struct{}), done: make(chan struct{})}
	if c.retain <= 0 {
		c.retain = DefaultRetain
	}
	c.out[0].max, c.out[1].max = int64(req.MaxOutput), int64(req.MaxOutput)
	if c.id != "" {
		if err := s.hold(c); err != nil {
			return nil, err
		}
	}
	started := false
	defer func() {
		if !started && c.id != "" {
			s.drop(c)
		}
	}()

	c.marker = "SANDGATE_EXEC=" + strconv.Itoa(os.Getpid()) + "." + strconv.FormatInt(execSeq.Add(1), 10)
	cmd.Env = append(cmd.Env, c.marker)
	cmd.SysProcAttr.Setsid = true // its own session and group: pgid = pid
	var stdin *os.File            // the write end of stdin's pipe, fed below
	if req.HasStdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		cmd.Stdin, stdin = inR, inW
	}
	outR, errR, err := outputPipes(cmd)
	if err != nil {
		if stdin != nil {
			cmd.Stdin.(*os.File).Close()
			stdin.Close()
		}
		return nil, err
	}
	ooms := s.opts.OOMKills()
	c.started = time.Now()
	run := cmd
	if d := directCommand(cmd, req.Command, req.User); d != nil {
		run = d
	}
	waited, err := s.spawn(run, run.Start, !req.PreserveBackground)
	if err != nil && run != cmd {
		// The kernel would not run the program (a script without #!,
		// say): bash runs it, or says why not.
		run = cmd
		waited, err = s.spawn(run, run.Start, !req.PreserveBackground)
	}
	closeChildOutputs(cmd)
	if stdin != nil {
		cmd.Stdin.(*os.File).Close() // the child's end
	}
	if err != nil {
		outR.Close()
		errR.Close()
		if stdin != nil {
			stdin.Close()
		}
		return nil, fmt.Errorf("start %s: %w", cmd.Path, unwrapExec(err))
	}
	started = true
	c.pid = run.Process.Pid
	run.Process.Release()
	if stdin != nil {
		go func() {
			stdin.Write(req.Stdin) // fails once the command is gone: fine
			stdin.Close()
		}()
	}
	var wg sync.WaitGroup
	wg.Add(2)
	pipes := [2]*os.File{outR, errR}
	var caught [2]chan struct{}
	for i, r := range pipes {
		caught[i] = make(chan struct{})
		go c.keep(&wg, r, i, caught[i])
	}
	go c.supervise(&wg, waited, timeout, req.PreserveBackground, ooms, pipes, caught)
	return c, nil
}

// keep appends what r yields to spool i until EOF. A read deadline on r
// is supervise's call to catch up (the tree has ended, r is still open):
// keep then takes exactly what the pipe holds, the last of what the tree
// wrote however far behind the reader was, and closes caught (as it does
// at EOF). Past the end it discards, draining for the processes that
// still hold the pipe (preserved background services).
func (c *command) keep(wg *sync.WaitGroup, r *os.File, i int, caught chan struct{}) {
	defer wg.Done()
	defer r.Close()
	caughtUp := false
	defer func() {
		if !caughtUp {
			close(caught)
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.append(i, buf[:n])
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && !caughtUp {
			r.SetReadDeadline(time.Time{})
			c.takePending(r, i, buf)
			caughtUp = true
			close(caught)
			continue
		}
		if err != nil {
			return
		}
	}
}

// takePending appends to spool i what pipe r holds now, and no more: what
// arrives later may come from a writer that never stops.
func (c *command) takePending(r *os.File, i int, buf []byte) {
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	pending := 0
	rc.Control(func(fd uintptr) {
		pending, err = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
	})
	for err == nil && pending > 0 {
		var n int
		n, err = r.Read(buf[:min(pending, len(buf))])
		c.append(i, buf[:n])
		pending -= n
	}
}

// append keeps p in spool i, up to its cap.
func (c *command) append(i int, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sp := &c.out[i]
	if c.ended {
		return
	}
	keep := int(min(int64(len(p)), sp.max-sp.size))
	if keep < len(p) {
		sp.truncated = true
	}
	p = p[:keep]
	if room := memSpool - len(sp.mem); room > 0 {
		n := min(room, len(p))
		sp.mem = append(sp.mem, p[:n]...)
		sp.size += int64(n)
		p = p[n:]
	}
	if len(p) > 0 {
		if sp.f == nil {
			f, err := c.s.spill()
			if err != nil {
				// No room on the sandbox's disk (or none writable): what
				// is kept so far is all there will be.
				sp.max, sp.truncated = sp.size, true
				c.wake()
				return
			}
			sp.f = f
		}
		n, err := sp.f.WriteAt(p, sp.size-memSpool)
		sp.size += int64(n)
		if err != nil {
			sp.max, sp.truncated = sp.size, true
		}
	}
	c.wake()
}

// wake tells the command's watchers something changed. Caller holds c.mu.
func (c *command) wake() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// supervise waits for the command's end (its exit, its timeout or a
// kill), kills what must die with it, awaits its output (to EOF, or
// after drainGrace what the pipes hold then) and records the result.
func (c *command) supervise(wg *sync.WaitGroup, waited <-chan ExitStatus, timeout time.Duration, preserve bool, ooms int64, pipes [2]*os.File, caught [2]chan struct{}) {
	drained := make(chan struct{})
	go func() {
		wg.Wait()
		close(drained)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var res agentwire.ExecResult
	var st ExitStatus
	select {
	case st = <-waited:
		// The reaper killed its group before reaping it; the marker
		// finds what left the group.
		if !preserve {
			c.s.reaper.sweep(0, c.marker)
		}
	case <-timer.C:
		res.TimedOut = true
		c.s.reaper.sweep(c.pid, c.marker)
		st = <-waited
	case <-c.kill:
		c.s.reaper.sweep(c.pid, c.marker)
		st = <-waited
	}
	ran := time.Since(c.started)
	t := time.NewTimer(drainGrace)
	select {
	case <-drained:
	case <-t.C:
		// Something still holds a pipe (a preserved background process,
		// a leftover), or the readers are behind on a busy machine: take
		// what the pipes hold now, then keep nothing more.
		if testHookCatchUp != nil {
			testHookCatchUp()
		}
		for i, r := range pipes {
			r.SetReadDeadline(time.Now()) // fails once keep closed r: then caught is closed
			<-caught[i]
		}
	}
	t.Stop()
	res.ExitCode = st.Code()
	res.DurationUS = ran.Microseconds()
	res.CPUTimeUS = (time.Duration(st.Usage.Utime.Nano()) + time.Duration(st.Usage.Stime.Nano())).Microseconds()
	res.PeakRSS = st.Usage.Maxrss << 10
	res.OOMKilled = res.ExitCode == 128+int(syscall.SIGKILL) && c.s.opts.OOMKills() > ooms
	if res.TimedOut {
		res.ExitCode = 125
	}
	c.mu.Lock()
	res.Truncated = c.out[0].truncated || c.out[1].truncated
	c.res, c.ended, c.endedAt = res, true, time.Now()
	if c.id != "" {
		c.forget = time.AfterFunc(c.retain, func() { c.s.drop(c) })
	}
	c.wake()
	c.mu.Unlock()
	close(c.done)
}

// testHookCatchUp, if set, is called when supervise gives up waiting for
// EOF and takes what the pipes hold.
var testHookCatchUp func()

// stop kills the command's tree (once) and waits for its end.
func (c *command) stop() {
	c.killOnce.Do(func() { close(c.kill) })
	<-c.done
}

// signal sends sig to the command's process group while it runs.
func (c *command) signal(sig syscall.Signal) {
	c.s.reaper.SignalGroup(c.pid, sig)
}

// release closes the spools' files (the disk they hold is freed). The
// command must have ended and be held by no one.
func (c *command) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.out {
		if f := c.out[i].f; f != nil {
			f.Close()
		}
		c.out[i] = spool{size: c.out[i].size, max: c.out[i].max, truncated: c.out[i].truncated}
	}
	if c.forget != nil {
		c.forget.Stop()
	}
}

// info describes the command.
func (c *command) info() agentwire.CommandInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.infoLocked()
}

func (c *command) infoLocked() agentwire.CommandInfo {
	i := agentwire.CommandInfo{
		ID: c.id, Command: c.text, Running: !c.ended, StartedAt: c.started,
		StdoutSize: c.out[0].size, StderrSize: c.out[1].size,
		Truncated: c.out[0].truncated || c.out[1].truncated, MaxOutput: c.out[0].max,
	}
	if c.ended {
		code, at := c.res.ExitCode, c.endedAt
		i.ExitCode, i.FinishedAt, i.TimedOut = &code, &at, c.res.TimedOut
		i.DurationUS, i.CPUTimeUS, i.PeakRSS, i.OOMKilled = c.res.DurationUS, c.res.CPUTimeUS, c.res.PeakRSS, c.res.OOMKilled
	} else {
		i.DurationUS = time.Since(c.started).Microseconds()
	}
	return i
}

// hold registers c under its id, forgetting the oldest ended command when
// the agent holds MaxCommands.
func (s *Server) hold(c *command) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.commands[c.id]; ok {
		return providers.Errorf(providers.ErrConflict, "command %s exists", c.id)
	}
	var evict *command
	if len(s.commands) >= MaxCommands {
		for _, o := range s.commands {
			if o.isEnded() && (evict == nil || o.seq < evict.seq) {
				evict = o
			}
		}
		if evict == nil {
			return providers.Errorf(providers.ErrTooMany, "the sandbox already runs %d commands (the limit); delete one or let one end", MaxCommands)
		}
		delete(s.commands, evict.id)
	}
	s.cmdSeq++
	c.seq = s.cmdSeq
	s.commands[c.id] = c
	if evict != nil {
		go evict.release()
	}
	return nil
}

func (c *command) isEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// drop forgets c (if it is still the command held under its id) and
// frees its spools.
func (s *Server) drop(c *command) {
	s.mu.Lock()
	held := s.commands[c.id] == c
	if held {
		delete(s.commands, c.id)
	}
	s.mu.Unlock()
	if held {
		c.release()
	}
}

// held is the command held under id.
func (s *Server) held(id string) (*command, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.commands[id]
	if !ok {
		return nil, providers.Errorf(providers.ErrNotFound, "no command %q in this sandbox (ended more than its retention ago, deleted, or never started)", id)
	}
	return c, nil
}

// listCommands describes the held commands, oldest first.
func (s *Server) listCommands() []agentwire.CommandInfo {
	s.mu.Lock()
	cs := make([]*command, 0, len(s.commands))
	for _, c := range s.commands {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	slices.SortFunc(cs, func(a, b *command) int { return int(a.seq - b.seq) })
	out := make([]agentwire.CommandInfo, len(cs))
	for i, c := range cs {
		out[i] = c.info()
	}
	return out
}

// spill opens a file for a spool's overflow on the sandbox's own disk,
// unlinked so nothing in the sandbox finds it by name.
func (s *Server) spill() (f *os.File, err error) {
	if s.opts.Files != nil {
		s.opts.ForkOn(func() { f, err = s.opts.Files.Spill() })
		return f, err
	}
	return SpillFile(os.TempDir())
}

// SpillFile opens an unlinked file in dir (O_TMPFILE where the filesystem
// has it) for reading and writing.
func SpillFile(dir string) (*os.File, error) {
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), dir+"/(spool)"), nil
	}
	f, err := os.CreateTemp(dir, ".sandgate-spool-*")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	return f, nil
}

// watchClose returns a channel closed when the gateway closes its side
// of st (or the connection ends). Nothing else may read st.
func watchClose(st io.Reader) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		io.Copy(io.Discard, st)
		close(gone)
	}()
	return gone
}

// execCommand serves an exec stream: it starts the command, answers, and
// once the command ended sends its output and result. The gateway closing
// its side first kills the command unless it is durable (and not
// KillOnDisconnect): then it runs on, held, and the stream just ends.
func (s *Server) execCommand(st io.ReadWriteCloser, req agentwire.ExecRequest) {
	c, err := s.startCommand(req)
	if err != nil {
		// A start failure is the result's (as the exec contract has it).
		if agentwire.WriteMsg(st, agentwire.Reply{}) == nil {
			res := agentwire.ExecResult{Error: providers.Message(err), Kind: agentwire.KindOf(err)}
			b, _ := json.Marshal(res)
			agentwire.WriteFrame(st, agentwire.FrameResult, b)
		}
		return
	}
	info := c.info()
	if agentwire.WriteMsg(st, agentwire.Reply{Command: &info}) != nil {
		c.cancelled(req)
		return
	}
	select {
	case <-c.done:
	case <-watchClose(st):
		c.cancelled(req)
		return
	}
	c.mu.Lock()
	res, out := c.res, c.out
	c.mu.Unlock()
	buf := make([]byte, min(agentwire.MaxFrame, max(out[0].size, out[1].size)))
	for i, typ := range []byte{agentwire.FrameStdout, agentwire.FrameStderr} {
		for off := int64(0); off < out[i].size; {
			n, err := out[i].readAt(buf[:min(int64(len(buf)), out[i].size-off)], off)
			if err != nil && n == 0 {
				break // the spill file failed: what was read is what is sent
			}
			if agentwire.WriteFrame(st, typ, buf[:n]) != nil {
				s.endExec(c)
				return
			}
			off += int64(n)
		}
	}
	if res.OOMKilled {
		agentwire.WriteFrame(st, agentwire.FrameStderr, []byte(s.oomNote()))
	}
	b, _ := json.Marshal(res)
	if agentwire.WriteFrame(st, agentwire.FrameResult, b) == nil && c.id != "" {
		c.mu.Lock()
		if c.forget != nil && c.retain > deliveredRetain {
			c.forget.Reset(deliveredRetain)
		}
		c.mu.Unlock()
	}
	s.endExec(c)
}

// cancelled handles an exec whose gateway went away before its end.
func (c *command) cancelled(req agentwire.ExecRequest) {
	if c.id == "" || req.KillOnDisconnect {
		c.stop()
		c.s.endExec(c)
	}
}

// endExec frees an exec's command that is not held.
func (s *Server) endExec(c *command) {
	if c.id == "" {
		c.release()
	}
}

// commandOp serves the command.* ops.
func (s *Server) commandOp(st io.ReadWriteCloser, req agentwire.Request) {
	if req.Op == agentwire.OpCmdList {
		agentwire.WriteMsg(st, agentwire.Reply{Commands: s.listCommands()})
		return
	}
	if req.Op == agentwire.OpCmdStart {
		if req.Exec == nil || req.Exec.ID == "" {
			agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "command.start without a command or its id")))
			return
		}
		c, err := s.startCommand(*req.Exec)
		if err != nil {
			if agentwire.KindOf(err) == "" {
				err = providers.Wrap(providers.ErrInvalid, err, err.Error())
			}
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		info := c.info()
		agentwire.WriteMsg(st, agentwire.Reply{Command: &info})
		return
	}
	c, err := s.held(req.ID)
	if err != nil {
		agentwire.WriteMsg(st, agentwire.ErrorReply(err))
		return
	}
	switch req.Op {
	case agentwire.OpCmdGet:
	case agentwire.OpCmdWait:
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		select {
		case <-c.done:
		case <-t.C:
		case <-watchClose(st):
		}
		t.Stop()
	case agentwire.OpCmdSignal:
		if req.Signal <= 0 || req.Signal >= 65 {
			agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "unknown signal %d", req.Signal)))
			return
		}
		c.signal(syscall.Signal(req.Signal))
	case agentwire.OpCmdDelete:
		c.stop()
		s.drop(c)
		agentwire.WriteMsg(st, agentwire.Reply{})
		return
	case agentwire.OpCmdRead:
		s.readCommand(st, c, req)
		return
	}
	info := c.info()
	agentwire.WriteMsg(st, agentwire.Reply{Command: &info})
}

// readCommand serves command.read: the command as it is, then its output
// from the offsets asked for as frames, up to the sizes it announced, or
// with Follow as the command writes, then an exit frame with its final
// state once it ended and everything was sent.
func (s *Server) readCommand(st io.ReadWriteCloser, c *command, req agentwire.Request) {
	c.mu.Lock()
	info := c.infoLocked()
	c.mu.Unlock()
	for _, b := range []struct {
		name       string
		since, end int64
	}{{"stdout", req.Since, info.StdoutSize}, {"stderr", req.SinceErr, info.StderrSize}} {
		if b.since < 0 || b.since > b.end {
			agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid,
				"offset %d of %s is beyond its end (%d bytes so far)", b.since, b.name, b.end)))
			return
		}
	}
	if agentwire.WriteMsg(st, agentwire.Reply{Command: &info}) != nil {
		return
	}
	off := [2]int64{req.Since, req.SinceErr}
	var gone <-chan struct{}
	if req.Follow {
		gone = watchClose(st)
	}
	buf := make([]byte, 256<<10)
	for {
		c.mu.Lock()
		out, ended, changed := c.out, c.ended, c.changed
		fin := c.infoLocked()
		c.mu.Unlock()
		if !req.Follow {
			out[0].size, out[1].size = info.StdoutSize, info.StderrSize
		}
		for i, typ := range []byte{agentwire.FrameStdout, agentwire.FrameStderr} {
			for off[i] < out[i].size {
				n, err := out[i].readAt(buf[:min(int64(len(buf)), out[i].size-off[i])], off[i])
				if n == 0 && err != nil {
					return // the spool was released (the command deleted) or its file failed
				}
				if agentwire.WriteFrame(st, typ, buf[:n]) != nil {
					return
				}
				off[i] += int64(n)
			}
		}
		if !req.Follow {
			return
		}
		if ended {
			b, _ := json.Marshal(fin)
			agentwire.WriteFrame(st, agentwire.FrameExit, b)
			return
		}
		select {
		case <-changed:
		case <-gone:
			return
		}
	}
}
