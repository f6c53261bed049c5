// Package agentclient is the gateway's end of the agent protocol
// (package agentwire): a Client per connection to a sandbox's agent
// (package agent), Links to keep one per sandbox, and Via to run a
// provider's exec and file calls through it.
package agentclient

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// ErrGone is the cause of every call on a connection that has ended: the
// agent exited (or was killed), or the byte stream under it broke.
// Its kind is ErrUnavailable (503) unless a provider knows better.
var ErrGone = providers.Errorf(providers.ErrUnavailable, "the connection to the sandbox agent is gone")

// ErrViolation is the cause of a call's error when the agent broke the
// protocol (a length over its bound, a malformed message or frame, more
// bytes than it announced): the client closed the connection, and
// Violation says why. The call's error is ErrConflict, its message the
// violation.
var ErrViolation = errors.New("the gateway closed its connection to the sandbox's agent")

// Client is the gateway's end of one connection to an agent. It is safe
// for concurrent use; each call is a stream of its own.
//
// The agent runs inside the sandbox, whose root can replace it: the
// client trusts no length it announces beyond the bound of the call
// (replay: the ring asked for; frames: maxFrame; replies: maxReply;
// files: the size announced; exec output: the cap asked for) and
// allocates as bytes arrive. An agent that breaks the protocol gets its
// connection closed (see ErrViolation); its sandbox's provider then
// marks the sandbox in error with Violation as the reason.
type Client struct {
	ys     *yamux.Session
	agent  string
	forker int
	direct func(context.Context) (net.Conn, error) // see WithDirect

	mu        sync.Mutex // guards violation
	violation string
}

// Option configures a Client.
type Option func(*Client)

// WithDirect makes the client open a connection of its own with dial for
// each terminal attachment, instead of a stream on the shared
// connection: where connections are cheap (a local socket), output and
// keystrokes then skip the multiplexer.
func WithDirect(dial func(context.Context) (net.Conn, error)) Option {
	return func(c *Client) { c.direct = dial }
}

// Dial speaks the hello on conn and returns the client, or an error that
// names both protocol versions when the agent speaks another. conn is
// closed on error and by Close.
func Dial(ctx context.Context, conn io.ReadWriteCloser, opts ...Option) (*Client, error) {
	c, err := dial(ctx, conn, agentwire.Version)
	if err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// dial is Dial for a gateway that speaks protocol version (tests pass
// another).
func dial(ctx context.Context, conn io.ReadWriteCloser, version string) (*Client, error) {
	ys, err := yamux.Client(&agentwire.FrameConn{ReadWriteCloser: conn}, agentwire.MuxConfig())
	if err != nil {
		conn.Close()
		return nil, err
	}
	c := &Client{ys: ys}
	rep, st, err := c.call(ctx, agentwire.Request{Op: agentwire.OpHello, Version: version})
	if err != nil {
		ys.Close()
		return nil, fmt.Errorf("sandbox agent hello: %w", err)
	}
	st.Close()
	if rep.Version != version {
		ys.Close()
		return nil, fmt.Errorf("the sandbox agent speaks protocol %q (%s); this gateway speaks %s", rep.Version, rep.Agent, version)
	}
	c.agent, c.forker = rep.Agent, rep.Forker
	return c, nil
}

// Agent describes the agent (its build and protocol).
func (c *Client) Agent() string { return c.agent }

// Forker is the id of the thread the agent forks every command on, in
// the sandbox's pid namespace (a local sandbox's init), or 0.
func (c *Client) Forker() int { return c.forker }

// Done is closed when the connection ends.
func (c *Client) Done() <-chan struct{} { return c.ys.CloseChan() }

// Close ends the connection. The agent and its sessions keep running.
func (c *Client) Close() error { return c.ys.Close() }

// Violation is why the client closed the connection for a protocol
// violation ("agent protocol violation: ..."), or "".
func (c *Client) Violation() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.violation
}

// violate records the agent's violation, closes the connection and
// returns the error for the call that met it (see ErrViolation).
func (c *Client) violate(pe *agentwire.ProtocolError) error {
	c.mu.Lock()
	if c.violation == "" {
		c.violation = pe.Error()
	}
	c.mu.Unlock()
	c.ys.Close()
	return providers.Wrap(providers.ErrConflict, ErrViolation, pe.Error())
}

// fail is err, a violation when err is a *ProtocolError, or ErrGone when
// the connection has ended.
func (c *Client) fail(err error) error {
	if pe, ok := errors.AsType[*agentwire.ProtocolError](err); ok {
		return c.violate(pe)
	}
	if c.ys.IsClosed() {
		return fmt.Errorf("%w: %v", ErrGone, err)
	}
	return err
}

// open opens a stream that ctx aborts: when ctx ends, its reads and
// writes fail. stop releases the watch.
func (c *Client) open(ctx context.Context) (*yamux.Stream, func() bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	st, err := c.ys.OpenStream()
	if err != nil {
		return nil, nil, c.fail(err)
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	return st, stop, nil
}

// call opens a stream, sends req and reads the reply. A reply carrying an
// error is returned as that error (with its kind), the stream closed.
func (c *Client) call(ctx context.Context, req agentwire.Request) (agentwire.Reply, *yamux.Stream, error) {
	st, stop, err := c.open(ctx)
	if err != nil {
		return agentwire.Reply{}, nil, err
	}
	var rep agentwire.Reply
	err = agentwire.WriteMsg(st, req)
	if err == nil {
		err = agentwire.ReadMsg(st, &rep, agentwire.MaxReply)
	}
	stop()
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			return agentwire.Reply{}, nil, ctx.Err()
		}
		return agentwire.Reply{}, nil, c.fail(err)
	}
	if rep.Error != "" && req.Op != agentwire.OpHello {
		st.Close()
		return agentwire.Reply{}, nil, agentwire.RemoteError(rep.Error, rep.Kind)
	}
	if rep.Error != "" {
		st.Close()
		return agentwire.Reply{}, nil, errors.New(rep.Error)
	}
	return rep, st, nil
}

// stream is a yamux stream or a direct connection.
type stream interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
}

// callDirect is call on a connection of its own (see WithDirect).
func (c *Client) callDirect(ctx context.Context, req agentwire.Request) (agentwire.Reply, stream, error) {
	conn, err := c.direct(ctx)
	if err != nil {
		return agentwire.Reply{}, nil, c.fail(err)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	var rep agentwire.Reply
	_, err = conn.Write([]byte(agentwire.DirectMagic))
	if err == nil {
		err = agentwire.WriteMsg(conn, req)
	}
	if err == nil {
		err = agentwire.ReadMsg(conn, &rep, agentwire.MaxReply)
	}
	stop()
	switch {
	case err != nil && ctx.Err() != nil:
		conn.Close()
		return agentwire.Reply{}, nil, ctx.Err()
	case err != nil:
		conn.Close()
		return agentwire.Reply{}, nil, c.fail(err)
	case rep.Error != "":
		conn.Close()
		return agentwire.Reply{}, nil, agentwire.RemoteError(rep.Error, rep.Kind)
	}
	return rep, conn, nil
}

// simple is call for an op whose reply is all there is.
func (c *Client) simple(ctx context.Context, req agentwire.Request) (agentwire.Reply, error) {
	rep, st, err := c.call(ctx, req)
	if err == nil {
		st.Close()
	}
	return rep, err
}

// answerGrace is how long after a command's timeout the gateway waits
// for the agent's result.
var answerGrace = 30 * time.Second

// Exec runs one command and waits for it; ctx ending kills its tree.
// Each of stdout and stderr holds at most req.MaxOutput bytes (default
// providers.DefaultMaxOutput); an agent that sends more breaks the
// protocol (ErrViolation).
func (c *Client) Exec(ctx context.Context, req providers.ExecRequest) (providers.ExecResult, error) {
	req, err := req.Check()
	if err != nil {
		return providers.ExecResult{}, err
	}
	er := wireExec(req)
	er.ID, er.RetainMS, er.KillOnDisconnect = req.ID, req.Retain.Milliseconds(), req.KillOnDisconnect
	start := time.Now()
	_, st, err := c.call(ctx, agentwire.Request{Op: agentwire.OpExec, Exec: er})
	if err != nil {
		return providers.ExecResult{}, err
	}
	if req.Started != nil {
		req.Started()
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	// The agent answers by the command's timeout; one that does not (a
	// sandbox starving it) is given up on a while later, which cancels
	// the command, rather than holding the caller for ever.
	var late atomic.Bool
	giveUp := time.AfterFunc(req.Timeout+answerGrace, func() {
		late.Store(true)
		st.SetDeadline(time.Now())
	})
	defer giveUp.Stop()
	defer st.Close()
	var res providers.ExecResult
	var buf []byte
	for {
		typ, p, err := agentwire.ReadFrame(st, buf)
		if err != nil {
			if ctx.Err() != nil {
				return providers.ExecResult{}, ctx.Err()
			}
			if late.Load() {
				return providers.ExecResult{}, providers.Errorf(providers.ErrUnavailable,
					"the sandbox's agent gave no result %v after the command's timeout; the command was cancelled", answerGrace)
			}
			return providers.ExecResult{}, c.fail(fmt.Errorf("exec: %w", err))
		}
		buf = p[:0]
		switch typ {
		case agentwire.FrameStdout:
			if len(res.Stdout)+len(p) > req.MaxOutput {
				return providers.ExecResult{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("exec stdout over its cap of %d bytes", req.MaxOutput)})
			}
			res.Stdout = append(res.Stdout, p...)
		case agentwire.FrameStderr:
			// The agent's out-of-memory note may follow a full stderr.
			if len(res.Stderr)+len(p) > req.MaxOutput+noteSlack {
				return providers.ExecResult{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("exec stderr over its cap of %d bytes", req.MaxOutput)})
			}
			res.Stderr = append(res.Stderr, p...)
		case agentwire.FrameResult:
			var r agentwire.ExecResult
			if err := json.Unmarshal(p, &r); err != nil {
				return providers.ExecResult{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("an exec result that is not JSON (%v)", err)})
			}
			if r.Error != "" {
				return providers.ExecResult{}, agentwire.RemoteError(r.Error, r.Kind)
			}
			res.ExitCode, res.TimedOut, res.Truncated = r.ExitCode, r.TimedOut, r.Truncated || res.Truncated
			res.Duration = time.Duration(r.DurationUS) * time.Microsecond
			if res.Duration <= 0 {
				res.Duration = time.Since(start)
			}
			res.Usage = &providers.ExecUsage{
				CPUTime:    time.Duration(r.CPUTimeUS) * time.Microsecond,
				PeakMemory: r.PeakRSS,
				OOMKilled:  r.OOMKilled,
			}
			if res.Stdout == nil {
				res.Stdout = []byte{}
			}
			if res.Stderr == nil {
				res.Stderr = []byte{}
			}
			return res, nil
		default:
			return providers.ExecResult{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("frame %q on an exec stream", typ)})
		}
	}
}

// noteSlack is room past an exec's stderr cap for the agent's own notes
// (the out-of-memory kill).
const noteSlack = 4 << 10

// Open opens the regular file at path inside the sandbox, for reading or
// (created with its parents, truncated) for writing, and returns the file
// itself: the agent passes its descriptor over a direct connection, which
// must be a unix socket (WithDirect; a local sandbox's init). The gateway
// then streams through it; anything but a regular file is a lie.
func (c *Client) Open(ctx context.Context, path string, write bool) (*os.File, error) {
	if c.direct == nil {
		return nil, providers.Errorf(providers.ErrUnsupported, "open needs a direct connection")
	}
	conn, err := c.direct(ctx)
	if err != nil {
		return nil, c.fail(err)
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, providers.Errorf(providers.ErrUnsupported, "open needs a unix socket")
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()
	_, err = uc.Write([]byte(agentwire.DirectMagic))
	if err == nil {
		err = agentwire.WriteMsg(uc, agentwire.Request{Op: agentwire.OpOpen, Path: path, Write: write})
	}
	var rep agentwire.Reply
	var files []*os.File
	if err == nil {
		files, err = agentwire.ReadMsgFile(uc, &rep, agentwire.MaxReply)
	}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		closeAll()
		return nil, ctx.Err()
	case err != nil:
		closeAll()
		return nil, c.fail(err)
	case rep.Error != "":
		closeAll()
		return nil, agentwire.RemoteError(rep.Error, rep.Kind)
	case len(files) != 1:
		closeAll()
		return nil, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("open answered with %d descriptors, want 1", len(files))})
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(files[0].Fd()), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		closeAll()
		return nil, c.violate(&agentwire.ProtocolError{What: "open answered with a descriptor that is not a regular file"})
	}
	return files[0], nil
}

// Spawn starts argv in the sandbox in the background, in the sandbox's
// workdir and environment, its output discarded, and returns once it
// started (the entrypoint).
func (c *Client) Spawn(ctx context.Context, argv []string) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpSpawn, Exec: &agentwire.ExecRequest{Argv: argv}})
	return err
}

// SignalAll sends sig to every process of the sandbox but its agent, the
// sandbox's PID 1.
func (c *Client) SignalAll(ctx context.Context, sig syscall.Signal) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpSignalAll, Signal: int(sig)})
	return err
}

// KillAll SIGKILLs every descendant of the agent.
func (c *Client) KillAll(ctx context.Context) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpKillAll})
	return err
}

// StatFile describes the file at path (a symlink is not followed).
func (c *Client) StatFile(ctx context.Context, path string) (providers.FileInfo, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpStat, Path: path})
	if err != nil {
		return providers.FileInfo{}, err
	}
	if rep.File == nil {
		return providers.FileInfo{}, fmt.Errorf("agent protocol: a stat reply without the file")
	}
	return *rep.File, nil
}

// ListDir describes the entries of the directory at path.
func (c *Client) ListDir(ctx context.Context, path string) ([]providers.FileInfo, bool, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpReadDir, Path: path})
	if err != nil {
		return nil, false, err
	}
	if len(rep.Files) > providers.MaxDirEntries {
		rep.Files, rep.Truncated = rep.Files[:providers.MaxDirEntries], true
	}
	return rep.Files, rep.Truncated, nil
}

// ReadFile opens the regular file at path for streaming and returns its
// size. Closing the reader (or ctx ending) ends the stream.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	rep, st, err := c.call(ctx, agentwire.Request{Op: agentwire.OpRead, Path: path})
	if err != nil {
		return nil, 0, err
	}
	if rep.Size < 0 {
		st.Close()
		return nil, 0, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("file size %d", rep.Size)})
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	return &fileReader{st: st, stop: stop, size: rep.Size, left: rep.Size, c: c}, rep.Size, nil
}

// fileReader reads exactly the size the agent announced: it never asks
// the stream for more, and once the last byte is in it checks that the
// stream ends there (a byte more is a violation).
type fileReader struct {
	st   *yamux.Stream
	stop func() bool
	size int64
	left int64
	c    *Client
	err  error // sticky: the end of the file, or why it failed
}

func (f *fileReader) Read(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if f.left == 0 {
		f.err = f.end()
		return 0, f.err
	}
	if int64(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.st.Read(p)
	f.left -= int64(n)
	switch {
	case err == io.EOF && f.left > 0:
		err = f.c.fail(io.ErrUnexpectedEOF)
	case err == nil && f.left == 0:
		err = f.end()
	case err != nil && err != io.EOF:
		err = f.c.fail(err)
	}
	f.err = err
	return n, err
}

// endGrace is how long a file's stream may take to end after its last
// announced byte; an agent that keeps it open longer is let go quietly.
var endGrace = 5 * time.Second

// end waits (up to endGrace) for the stream to end after the announced
// bytes: io.EOF, or a violation if the agent sends more.
func (f *fileReader) end() error {
	f.st.SetReadDeadline(time.Now().Add(endGrace))
	var b [1]byte
	if n, _ := f.st.Read(b[:]); n > 0 {
		return f.c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("a file stream longer than the %d bytes announced", f.size)})
	}
	return io.EOF
}

func (f *fileReader) Close() error {
	f.stop()
	return f.st.Close()
}

// WriteFile streams r into the file at path, replacing it, and returns
// the bytes written.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader) (int64, error) {
	st, stop, err := c.open(ctx)
	if err != nil {
		return 0, err
	}
	defer stop()
	defer st.Close()
	if err := agentwire.WriteMsg(st, agentwire.Request{Op: agentwire.OpWrite, Path: path}); err != nil {
		return 0, c.fail(err)
	}
	// The agent may refuse before it has read everything: send on a
	// goroutine and stop sending when the reply comes.
	sent := make(chan error, 1)
	go func() {
		_, err := io.Copy(st, r)
		// EOF: the file is complete or, when r failed, ends the agent's
		// read so that it answers (else both ends wait for each other).
		if cerr := st.Close(); err == nil {
			err = cerr
		}
		sent <- err
	}()
	var rep agentwire.Reply
	rerr := agentwire.ReadMsg(st, &rep, agentwire.MaxReply)
	st.SetWriteDeadline(time.Now())
	serr := <-sent
	switch {
	case ctx.Err() != nil:
		return 0, ctx.Err()
	case serr != nil && !errors.Is(serr, yamux.ErrTimeout) && !errors.Is(serr, yamux.ErrStreamClosed):
		return 0, fmt.Errorf("write %s: %w", path, serr) // the source failed
	case rerr != nil:
		return 0, c.fail(fmt.Errorf("write %s: %w", path, rerr))
	case rep.Error != "":
		return 0, agentwire.RemoteError(rep.Error, rep.Kind)
	}
	return rep.Size, nil
}

// StartSession starts terminal session id (deferred: at its first
// attach, in that attach's mode), retaining ringBytes of output.
func (c *Client) StartSession(ctx context.Context, id string, spec providers.ProcessSpec, deferred bool, ringBytes int) (agentwire.SessionInfo, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpStart, Start: &agentwire.StartRequest{ID: id, Spec: spec, Deferred: deferred, RingBytes: ringBytes}})
	if err != nil {
		return agentwire.SessionInfo{}, err
	}
	if rep.Session == nil {
		return agentwire.SessionInfo{}, c.violate(&agentwire.ProtocolError{What: "a session.start reply without the session"})
	}
	return *rep.Session, nil
}

// Sessions lists the sessions the agent holds.
func (c *Client) Sessions(ctx context.Context) ([]agentwire.SessionInfo, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpList})
	return rep.Sessions, err
}

// DeleteSession kills a session's process and forgets it.
func (c *Client) DeleteSession(ctx context.Context, id string) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpDelete, Session: id})
	return err
}

// Shutdown asks the agent to exit (tests).
func (c *Client) Shutdown(ctx context.Context) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpShutdown})
	return err
}

// Attach subscribes to session id's output from offset since. tty, when
// not nil, is the mode a deferred session starts in. maxReplay (> 0) bounds
// the replay: the ring the session was started with (a session whose
// ring is larger replays only its last maxReplay bytes); an agent that
// announces a longer one breaks the protocol (ErrViolation).
func (c *Client) Attach(ctx context.Context, id string, since int64, tty *bool, maxReplay int) (*Attachment, error) {
	req := agentwire.Request{Op: agentwire.OpAttach, Session: id, Since: since, TTY: tty, MaxReplay: int64(maxReplay)}
	var rep agentwire.Reply
	var st stream
	var err error
	if c.direct != nil {
		rep, st, err = c.callDirect(ctx, req)
	} else {
		rep, st, err = c.call(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	if rep.Session == nil {
		st.Close()
		return nil, c.violate(&agentwire.ProtocolError{What: "an attach reply without the session"})
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	p, err := readReplay(st, maxReplay)
	stop()
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.fail(err)
	}
	// A small read buffer: an attachment waiting for output (a gateway
	// holds one per attached terminal) holds only it.
	a := &Attachment{st: st, r: bufio.NewReader(st), c: c, Info: *rep.Session, From: rep.Replay, Replay: p}
	if s, ok := st.(interface{ Shrink() }); ok {
		// A yamux stream keeps the buffer of its largest burst (as large as
		// its window, up to 1 MiB: muxConfig) unless told to let it go. Told
		// on every wait, it would allocate anew for every frame of a stream
		// (PTY throughput -20%): told once it has waited a while.
		a.idle = time.AfterFunc(shrinkAfter, s.Shrink)
	}
	return a, nil
}

// readReplay reads an attach's replay frame, of at most limit bytes.
func readReplay(r io.Reader, limit int) ([]byte, error) {
	typ, n, err := agentwire.ReadFrameHeader(r, math.MaxUint32)
	if err != nil {
		return nil, err
	}
	if typ != agentwire.FrameReplay {
		return nil, agentwire.ProtocolErrorf("frame %q before the replay", typ)
	}
	if n > limit {
		return nil, agentwire.ProtocolErrorf("replay length %d over %d", n, limit)
	}
	return agentwire.ReadPayload(r, nil, n)
}

// shrinkAfter is how long an attachment waits for output before its
// stream lets its buffer go.
var shrinkAfter = time.Second

// Attachment is one subscription to a session: the replay, then Next.
type Attachment struct {
	Info   agentwire.SessionInfo // at the attach
	From   int64                 // the offset of Replay's first byte
	Replay []byte                // up to a whole ring: drop it once used

	st   stream
	r    *bufio.Reader // st
	c    *Client
	wmu  sync.Mutex
	buf  *[]byte     // the last event's payload, from framePool
	typ  byte        // the output frame being returned in pieces, and
	left int         // how much of its payload is still to read
	idle *time.Timer // shrinks st's buffer once Next has waited shrinkAfter
}

// framePool recycles attachments' payload buffers, so that one waiting
// for output holds none. Its buffers hold a whole coalesced terminal frame.
var framePool = sync.Pool{New: func() any { b := make([]byte, agentwire.CoalesceTTY); return &b }}

// Event is what Next returns: output on a channel (wire.ChanOutput or
// wire.ChanStderr), or the exit.
type Event struct {
	Chan   byte
	Data   []byte // valid until the next call
	Exited bool
	Code   int
	Lost   bool // the process ended without an exit status
	// Slow: the reader fell a whole ring behind and output was lost to
	// it; the attachment is over (attach again with since).
	Slow bool
}

// Next blocks for the next output or the exit. After the exit (or an
// error) the attachment is over.
func (a *Attachment) Next() (Event, error) {
	if a.buf != nil {
		if cap(*a.buf) == agentwire.CoalesceTTY {
			framePool.Put(a.buf)
		}
		a.buf = nil
	}
	if a.idle != nil {
		a.idle.Reset(shrinkAfter)
	}
	typ, n := a.typ, a.left
	if n == 0 {
		var err error
		if typ, n, err = agentwire.ReadFrameHeader(a.r, agentwire.MaxFrame); err != nil {
			return Event{}, a.c.fail(err)
		}
	}
	a.typ, a.left = 0, 0
	if k := agentwire.CoalesceTTY; n > k && (typ == agentwire.FrameStdout || typ == agentwire.FrameStderr) {
		// Output larger than a pooled buffer (a pipe's frames are as large
		// as what is pending, up to MaxFrame) is returned a buffer at a
		// time: a fresh buffer per frame cost the gateway more in
		// allocation and page faults than the copy itself.
		a.typ, a.left, n = typ, n-k, k
	}
	var p []byte
	var err error
	if n <= agentwire.CoalesceTTY {
		a.buf = framePool.Get().(*[]byte)
		p = (*a.buf)[:n]
		_, err = io.ReadFull(a.r, p)
	} else {
		// A larger exit frame: grown as it arrives.
		p, err = agentwire.ReadPayload(a.r, nil, n)
		a.buf = &p
	}
	if err != nil {
		return Event{}, a.c.fail(err)
	}
	switch typ {
	case agentwire.FrameStdout:
		return Event{Chan: 0x01, Data: p}, nil
	case agentwire.FrameStderr:
		return Event{Chan: 0x02, Data: p}, nil
	case agentwire.FrameSlow:
		return Event{Slow: true}, nil
	case agentwire.FrameExit:
		var x agentwire.ExitInfo
		if err := json.Unmarshal(p, &x); err != nil {
			return Event{}, a.c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("an exit frame that is not JSON (%v)", err)})
		}
		return Event{Exited: true, Code: x.Code, Lost: x.Lost}, nil
	}
	return Event{}, a.c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("frame %q on an attachment", typ)})
}

func (a *Attachment) send(typ byte, p []byte) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if err := agentwire.WriteFrame(a.st, typ, p); err != nil {
		return a.c.fail(err)
	}
	return nil
}

// Input writes to the process's terminal or stdin.
func (a *Attachment) Input(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), agentwire.MaxFrame)
		if err := a.send(agentwire.FrameStdin, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin sends EOF (pipe mode).
func (a *Attachment) CloseStdin() error { return a.send(agentwire.FrameEOF, nil) }

// Resize sets the terminal's size.
func (a *Attachment) Resize(rows, cols uint16) error {
	var b [4]byte
	binary.BigEndian.PutUint16(b[:], rows)
	binary.BigEndian.PutUint16(b[2:], cols)
	return a.send(agentwire.FrameResize, b[:])
}

// Signal delivers sig to the foreground group (TTY) or the process group.
func (a *Attachment) Signal(sig syscall.Signal) error {
	return a.send(agentwire.FrameSignal, []byte{byte(sig)})
}

// Close ends the subscription; the session goes on.
func (a *Attachment) Close() error {
	if a.idle != nil {
		a.idle.Stop()
	}
	a.st.SetDeadline(time.Now())
	return a.st.Close()
}

// Provider is implemented by providers whose sandboxes run the agent:
// Agent returns the connection to sandbox id's.
type Provider interface {
	Agent(ctx context.Context, id string) (*Client, error)
}
