package e2b

import (
	"context"
	"errors"
	"math"
	"strconv"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/e2b/envd/process"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/pty"
)

// The data plane's PTY processes: sandgate's terminal sessions (package
// pty creates them, with its limits; the streams here attach to the
// sandbox's agent as the terminal WebSocket does). A PTY started through
// E2B is also a session of /v1/sandboxes/{id}/pty, its tag the session
// id.

// sessionPrefix begins every terminal session's id.
const sessionPrefix = "pty-"

// replayBytes bounds what an attachment replays (a session started here
// replays from its start: its first output).
const replayBytes = 1 << 20

// noReplay is an offset past any session's output: an attachment from it
// replays nothing.
const noReplay = math.MaxInt64 / 2

// startSession starts a process as a terminal session: a PTY (tty), or
// pipes whose stdin stays open for SendInput and CloseStdin (a command
// started with stdin: true).
func (p *processServer) startSession(ctx context.Context, t target, tty bool, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	if p.s.pty == nil {
		if tty {
			return unsupported("a PTY process")
		}
		return unsupported("a process with stdin")
	}
	m := req.Msg
	size := m.Pty.GetSize()
	if size.GetRows() > math.MaxUint16 || size.GetCols() > math.MaxUint16 {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("pty.size rows and cols must be at most 65535"))
	}
	info, err := p.s.pty.Create(ctx, t.c, t.id, providers.ProcessSpec{
		Command: commandLine(m.Process.Cmd, m.Process.Args),
		Cwd:     m.Process.GetCwd(),
		Env:     m.Process.Envs,
		User:    t.user,
		TTY:     tty,
		Rows:    uint16(size.GetRows()),
		Cols:    uint16(size.GetCols()),
	}, pty.StartAtAttach) // started by followSession's attach: no output before it

	if err != nil {
		return p.s.connectErr(err)
	}
	ev := &processEvents{send: func(e *process.ProcessEvent) error { return st.Send(&process.StartResponse{Event: e}) }, alive: processAlive}
	// The start event (the pid a client then sends input or a signal to)
	// goes out once the attach has started the process in its mode: an
	// input that came first would attach without one and start it in a
	// PTY.
	stop := func() {}
	defer func() { stop() }()
	return p.followSession(ctx, t, info.ID, tty, -1, ev, func() error {
		if err := ev.event(startEvent(pidOf(info.ID))); err != nil {
			return err
		}
		stop = ev.keepalive(req.Header())
		return nil
	})
}

// attach attaches to session sid of t's sandbox from offset since
// (starting it in mode tty if it was deferred).
func (p *processServer) attach(ctx context.Context, t target, sid string, since int64, tty *bool) (*agentclient.Attachment, error) {
	h, err := p.s.svc.SessionHost(ctx, t.c, t.id)
	if err != nil {
		return nil, err
	}
	return h.Attach(ctx, sid, since, tty, replayBytes)
}

// followSession streams session sid's output from offset since as data
// events (pty, else stdout and stderr) until it exits, then its end
// event; attached (if not nil) is called once the attach is in place,
// before any of them. since -1: the session was created to start at this
// attach, in mode tty, and is followed from its start.
func (p *processServer) followSession(ctx context.Context, t target, sid string, tty bool, since int64, ev *processEvents, attached func() error) error {
	var mode *bool
	if since < 0 {
		since, mode = 0, &tty
		if testHookBeforeStart != nil {
			testHookBeforeStart()
		}
	}
	a, err := p.attach(ctx, t, sid, since, mode)
	if err != nil {
		return p.s.connectErr(err)
	}
	defer a.Close()
	if attached != nil {
		if err := attached(); err != nil {
			return err
		}
	}
	stop := context.AfterFunc(ctx, func() { a.Close() })
	defer stop()
	send := func(b []byte, stderr bool) error {
		out := append([]byte(nil), b...)
		data := &process.ProcessEvent_DataEvent{}
		switch {
		case tty:
			data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: out}
		case stderr:
			data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: out}
		default:
			data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: out}
		}
		return ev.event(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}})
	}
	if len(a.Replay) > 0 && tty { // a pipe session's replay does not say which stream: dropped
		if err := send(a.Replay, false); err != nil {
			return err
		}
		a.Replay = nil
	}
	for {
		e, err := a.Next()
		if err != nil {
			if ctx.Err() != nil {
				return connect.NewError(connect.CodeCanceled, ctx.Err())
			}
			return p.s.connectErr(err)
		}
		switch {
		case e.Slow:
			return connect.NewError(connect.CodeResourceExhausted, errors.New("the client fell a whole output ring behind; connect again"))
		case e.Exited:
			end := &process.ProcessEvent_EndEvent{Exited: !e.Lost, ExitCode: int32(e.Code), Status: "exit status " + strconv.Itoa(e.Code)}
			if e.Lost {
				msg := "the process ended without an exit status"
				end.Error = &msg
			}
			return ev.event(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
		default:
			if err := send(e.Data, e.Chan == 0x02); err != nil {
				return err
			}
		}
	}
}

// testHookBeforeStart, if set, is called before the attach that starts a
// session created by Start (tests widen the moment before it).
var testHookBeforeStart func()

// withSession attaches to session sid (replaying nothing), calls f with
// the attachment, and detaches.
func (p *processServer) withSession(ctx context.Context, t target, sid string, f func(*agentclient.Attachment) error) error {
	a, err := p.attach(ctx, t, sid, noReplay, nil)
	if err != nil {
		return err
	}
	defer a.Close()
	return f(a)
}

// signalPTY sends sig to session sid: SIGKILL ends it (its process group
// killed, the session forgotten, as DELETE …/pty/{sid} does), SIGTERM
// goes to its foreground group.
func (p *processServer) signalPTY(ctx context.Context, t target, sid, sig string) error {
	if sig == "SIGKILL" {
		return p.s.pty.Delete(ctx, t.c, t.id, sid)
	}
	return p.withSession(ctx, t, sid, func(a *agentclient.Attachment) error { return a.Signal(syscall.SIGTERM) })
}

// SendInput writes to a PTY's terminal or to the stdin of a process
// started with stdin: true; a durable command's stdin is closed once it
// starts.
func (p *processServer) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	x, err := p.find(ctx, t, req.Msg.Process)
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	if x.sid == "" {
		return nil, unsupported("stdin to a command started without stdin: true")
	}
	in := req.Msg.Input
	data := in.GetPty()
	if data == nil {
		data = in.GetStdin()
	}
	if err := p.withSession(ctx, t, x.sid, func(a *agentclient.Attachment) error { return a.Input(data) }); err != nil {
		return nil, p.s.connectErr(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// Update resizes a PTY.
func (p *processServer) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	size := req.Msg.Pty.GetSize()
	if size == nil {
		return connect.NewResponse(&process.UpdateResponse{}), nil
	}
	if size.Rows == 0 || size.Cols == 0 || size.Rows > math.MaxUint16 || size.Cols > math.MaxUint16 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pty.size rows and cols must be between 1 and 65535"))
	}
	x, err := p.find(ctx, t, req.Msg.Process)
	if err == nil && x.sid == "" {
		err = providers.Errorf(providers.ErrInvalid, "the process has no PTY")
	}
	if err == nil {
		err = p.withSession(ctx, t, x.sid, func(a *agentclient.Attachment) error {
			return a.Resize(uint16(size.Rows), uint16(size.Cols))
		})
	}
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// CloseStdin closes the stdin of a process started with stdin: true (a
// PTY's is its terminal: send Ctrl-D); a durable command's is closed
// already.
func (p *processServer) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	x, err := p.find(ctx, t, req.Msg.Process)
	if err == nil && x.sid != "" {
		if x.tty {
			err = providers.Errorf(providers.ErrInvalid, "a PTY has no stdin to close: send Ctrl-D (0x04)")
		} else {
			err = p.withSession(ctx, t, x.sid, func(a *agentclient.Attachment) error { return a.CloseStdin() })
		}
	}
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}
