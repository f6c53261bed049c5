package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/e2b/envd/process"
	"github.com/sandgate/sandgate/internal/e2b/envd/process/processconnect"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/wire"
)

// The data plane's process service, over sandgate's durable commands.

// target is the sandbox a data-plane request is for and its verified
// caller: the sandbox from E2b-Sandbox-Id, the credential from
// X-Access-Token (an owner lease, as create and connect give it), the
// user from the Basic authorization the SDKs send ("" = the sandbox's
// default user).
type target struct {
	c    sandbox.Caller
	id   string
	user string
}

func (s *server) target(ctx context.Context, h http.Header) (target, error) {
	id := strings.TrimSpace(h.Get("E2b-Sandbox-Id"))
	if id == "" {
		return target{}, providers.InvalidFields{{Field: "E2b-Sandbox-Id", Message: "header is required: it names the sandbox (E2B_SANDBOX_URL serves every sandbox)"}}
	}
	tok := strings.TrimSpace(h.Get("X-Access-Token"))
	if tok == "" {
		return target{}, providers.Errorf(providers.ErrUnauthorized, "the X-Access-Token header is required (the sandbox's envdAccessToken)")
	}
	c, _, err := s.svc.Authenticate(ctx, sandbox.Caller{Lease: tok}, id)
	if err != nil {
		return target{}, err
	}
	user, err := basicUser(h.Get("Authorization"))
	if err != nil {
		return target{}, err
	}
	return target{c: c, id: id, user: user}, nil
}

// basicUser is the user name of a Basic authorization ("" if none).
func basicUser(auth string) (string, error) {
	b64, ok := strings.CutPrefix(auth, "Basic ")
	if !ok {
		return "", nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(b64))
	if err != nil {
		return "", providers.InvalidFields{{Field: "Authorization", Message: "is not valid Basic authorization"}}
	}
	user, _, _ := strings.Cut(string(raw), ":")
	return user, nil
}

// processTimeout bounds a process started through E2B: envd's run until
// killed; sandgate's commands all have a deadline, and the sandbox's own
// lifetime ends them sooner.
const processTimeout = 24 * time.Hour

// pidOf is the pid E2B sees for durable command or terminal session
// id: 31 bits of a hash of the id, so that the pid is found again from the
// agent's lists after a gateway restart (nothing is kept in the gateway).
func pidOf(id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	pid := h.Sum32() & 0x7fffffff
	if pid == 0 {
		pid = 1
	}
	return pid
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// bash is the shell the E2B SDKs run every command and terminal with.
const bash = "/bin/bash"

// commandLine is cmd with args as one shell command line. E2B's templates
// all have bash, which the SDKs name; an image without it (busybox,
// alpine) runs the same arguments with /bin/sh instead.
func commandLine(cmd string, args []string) string {
	quoted := make([]string, 0, len(args))
	for _, a := range args {
		quoted = append(quoted, shellQuote(a))
	}
	line := "exec " + shellQuote(cmd) + " " + strings.Join(quoted, " ")
	if cmd != bash {
		return line
	}
	return "if [ -x " + bash + " ]; then " + line + "; fi; exec /bin/sh " + strings.Join(quoted, " ")
}

type processServer struct {
	processconnect.UnimplementedProcessHandler
	s *server
}

// eventSender sends a stream's events (E: a process's or a watch's) one
// at a time (the keepalives come from another goroutine).
type eventSender[E any] struct {
	mu    sync.Mutex
	send  func(E) error
	alive E // the keepalive event
}

// processEvents sends a process's events.
type processEvents = eventSender[*process.ProcessEvent]

// processAlive is a process stream's keepalive event.
var processAlive = &process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}

func (e *eventSender[E]) event(ev E) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.send(ev)
}

// keepalive sends a keepalive event every interval the client asked for
// (Keepalive-Ping-Interval, seconds) until stop is called.
func (e *eventSender[E]) keepalive(h http.Header) (stop func()) {
	sec, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || sec <= 0 {
		return func() {}
	}
	t := time.NewTicker(time.Duration(min(sec, 300)) * time.Second)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if e.event(e.alive) != nil {
					return
				}
			}
		}
	})
	return func() {
		t.Stop()
		close(done)
		wg.Wait()
	}
}

func startEvent(pid uint32) *process.ProcessEvent {
	return &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}
}

// follow streams command cid's output from offsets since until it ends,
// then its end event.
func (p *processServer) follow(ctx context.Context, t target, cid string, since [2]int64, ev *processEvents) error {
	cmd, err := p.s.svc.ReadCommand(ctx, t.c, t.id, cid, since, true, func(sandbox.Command) error { return nil },
		func(o sandbox.Output) error {
			data := &process.ProcessEvent_DataEvent{}
			out := append([]byte(nil), o.Data...)
			if o.Stdout {
				data.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: out}
			} else {
				data.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: out}
			}
			return ev.event(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}})
		})
	if err != nil {
		// The client went away or its timeout (Connect-Timeout-Ms) passed:
		// the process runs on, durable, to be connected to again.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the stream's timeout passed; the process still runs"))
		}
		if ctx.Err() != nil {
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
		return p.s.connectErr(err)
	}
	end := &process.ProcessEvent_EndEvent{Exited: true}
	if cmd.ExitCode != nil {
		end.ExitCode = int32(*cmd.ExitCode)
		end.Status = fmt.Sprintf("exit status %d", *cmd.ExitCode)
	}
	if cmd.TimedOut {
		msg := "the process ran out of time and was killed"
		end.Status, end.Error = "timeout", &msg
	}
	return ev.event(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
}

func (p *processServer) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return p.s.connectErr(err)
	}
	m := req.Msg
	if m.Process == nil || m.Process.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd must not be empty"))
	}
	if m.Pty != nil || m.GetStdin() {
		return p.startSession(ctx, t, m.Pty != nil, req, st)
	}
	timeout := processTimeout
	cmd, err := p.s.svc.StartCommand(ctx, t.c, t.id, sandbox.CommandRequest{ExecRequest: sandbox.ExecRequest{
		Command: commandLine(m.Process.Cmd, m.Process.Args),
		Cwd:     m.Process.GetCwd(),
		Env:     m.Process.Envs,
		Timeout: &timeout,
		User:    t.user,
	}})
	if err != nil {
		return p.s.connectErr(err)
	}
	ev := &processEvents{send: func(e *process.ProcessEvent) error { return st.Send(&process.StartResponse{Event: e}) }, alive: processAlive}
	if err := ev.event(startEvent(pidOf(cmd.ID))); err != nil {
		return err
	}
	stop := ev.keepalive(req.Header())
	defer stop()
	return p.follow(ctx, t, cmd.ID, [2]int64{}, ev)
}

// proc is a process as E2B sees it: a durable command or, for a PTY or
// a process started with stdin, a terminal session (sid set).
type proc struct {
	cmd sandbox.Command
	sid string
	tty bool  // the session is a PTY
	off int64 // a session's output offset now
}

func (x proc) id() string {
	if x.sid != "" {
		return x.sid
	}
	return x.cmd.ID
}

// find is the command or session a selector names: by tag (its id) or by
// pid.
func (p *processServer) find(ctx context.Context, t target, sel *process.ProcessSelector) (proc, error) {
	var want func(string) bool
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Tag:
		if !strings.HasPrefix(v.Tag, sessionPrefix) {
			cmd, err := p.s.svc.Command(ctx, t.c, t.id, v.Tag)
			return proc{cmd: cmd}, err
		}
		want = func(id string) bool { return id == v.Tag }
	case *process.ProcessSelector_Pid:
		want = func(id string) bool { return pidOf(id) == v.Pid }
	default:
		return proc{}, providers.InvalidFields{{Field: "process", Message: "must select a process by pid or tag"}}
	}
	var found []proc
	if _, ok := sel.GetSelector().(*process.ProcessSelector_Pid); ok {
		list, err := p.s.svc.Commands(ctx, t.c, t.id)
		if err != nil {
			return proc{}, err
		}
		for _, c := range list {
			if want(c.ID) {
				found = append(found, proc{cmd: c})
			}
		}
	}
	if p.s.pty != nil {
		sessions, err := p.s.pty.List(ctx, t.c, t.id)
		if err != nil {
			return proc{}, err
		}
		for _, si := range sessions {
			if want(si.ID) {
				found = append(found, proc{sid: si.ID, tty: si.Mode == wire.ModePTY, off: si.OutputOffset})
			}
		}
	}
	switch len(found) {
	case 0:
		return proc{}, providers.Errorf(providers.ErrNotFound, "no such process")
	case 1:
		return found[0], nil
	}
	return proc{}, providers.Errorf(providers.ErrConflict, "the pid names more than one process: select it by tag")
}

// Connect streams a process's output from now on, then its end.
func (p *processServer) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], st *connect.ServerStream[process.ConnectResponse]) error {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return p.s.connectErr(err)
	}
	x, err := p.find(ctx, t, req.Msg.Process)
	if err != nil {
		return p.s.connectErr(err)
	}
	ev := &processEvents{send: func(e *process.ProcessEvent) error { return st.Send(&process.ConnectResponse{Event: e}) }, alive: processAlive}
	if err := ev.event(startEvent(pidOf(x.id()))); err != nil {
		return err
	}
	stop := ev.keepalive(req.Header())
	defer stop()
	if x.sid != "" {
		return p.followSession(ctx, t, x.sid, x.tty, x.off, ev, nil)
	}
	return p.follow(ctx, t, x.cmd.ID, [2]int64{x.cmd.StdoutSize, x.cmd.StderrSize}, ev)
}

// List lists the running processes (tag: the command id).
func (p *processServer) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	list, err := p.s.svc.Commands(ctx, t.c, t.id)
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	res := &process.ListResponse{}
	for _, c := range list {
		if !c.Running {
			continue
		}
		tag := c.ID
		res.Processes = append(res.Processes, &process.ProcessInfo{
			Pid: pidOf(c.ID), Tag: &tag,
			Config: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", c.Command}},
		})
	}
	if p.s.pty != nil {
		sessions, err := p.s.pty.List(ctx, t.c, t.id)
		if err != nil {
			return nil, p.s.connectErr(err)
		}
		for _, si := range sessions {
			if !si.Running {
				continue
			}
			tag := si.ID
			res.Processes = append(res.Processes, &process.ProcessInfo{
				Pid: pidOf(si.ID), Tag: &tag, Config: &process.ProcessConfig{Cmd: "/bin/sh"},
			})
		}
	}
	return connect.NewResponse(res), nil
}

// SendSignal sends SIGTERM or SIGKILL to a process's group.
func (p *processServer) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t, err := p.s.target(ctx, req.Header())
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	var sig string
	switch req.Msg.Signal {
	case process.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	case process.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL"))
	}
	x, err := p.find(ctx, t, req.Msg.Process)
	switch {
	case err != nil:
	case x.sid != "":
		err = p.signalPTY(ctx, t, x.sid, sig)
	default:
		err = p.s.svc.SignalCommand(ctx, t.c, t.id, x.cmd.ID, sig)
	}
	if err != nil {
		return nil, p.s.connectErr(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

func (p *processServer) StreamInput(context.Context, *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	return nil, unsupported("input to a running process")
}
