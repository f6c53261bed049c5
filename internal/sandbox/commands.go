package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/wire"
)

// Durable commands are held by the sandbox's agent (see package agent):
// the service chooses their ids, checks the caller and the request, and
// passes each call on. Nothing about a command is kept in the gateway, so
// any replica serves it, also after a restart.

// Command is a durable command as the sandbox's agent describes it.
type Command = agentclient.Command

// Output is a piece of a command's output (see ReadCommand).
type Output = agentclient.Output

// The durable commands' defaults and bounds.
const (
	DefaultCommandOutput    = 64 << 20 // bytes kept per stream
	MaxCommandOutput        = 1 << 30
	DefaultCommandRetention = time.Hour
	DefaultCommandWait      = 30 * time.Second
	MaxCommandWait          = 300 * time.Second
)

// CommandRequest starts a durable command: the exec request (its Started
// and KillOnDisconnect are not used) and the cap of each stream.
type CommandRequest struct {
	ExecRequest
	MaxOutput int64 // bytes kept of stdout and of stderr each; 0 = DefaultCommandOutput
}

// commandPrefix and commandHex make a command id: the prefix and 16
// lowercase hex characters.
const (
	commandPrefix = "cmd-"
	commandHex    = 16
)

// newCommandID returns a fresh random command id.
func newCommandID() string {
	b := make([]byte, commandHex/2)
	rand.Read(b) // crypto/rand never fails on Linux
	return commandPrefix + hex.EncodeToString(b)
}

// validCommandID reports whether cid is shaped as newCommandID makes ids.
func validCommandID(cid string) bool {
	return agentclient.ValidID(cid, commandPrefix, commandHex)
}

// StartCommand starts a durable command in sandbox id and returns it,
// running. It is validated as Exec validates; a command that cannot start
// (an unknown user, a missing cwd) is ErrInvalid.
func (s *Service) StartCommand(ctx context.Context, c Caller, id string, req CommandRequest) (Command, error) {
	var bad providers.InvalidFields
	timeout, stdin := s.checkExec(req.ExecRequest, &bad)
	maxOut := req.MaxOutput
	switch {
	case maxOut == 0:
		maxOut = DefaultCommandOutput
	case maxOut < 0 || maxOut > MaxCommandOutput:
		bad.Add("max_output_bytes", "must be between 1 and %d", MaxCommandOutput)
	}
	if err := bad.Err(); err != nil {
		return Command{}, err
	}
	ag, b, end, err := s.agentHost(ctx, c, id, "durable commands", nil)
	if err != nil {
		return Command{}, err
	}
	defer end()
	cmd, err := ag.StartCommand(ctx, agentclient.CommandRequest{
		ExecRequest: execFor(b, req.ExecRequest, timeout, stdin, int(maxOut)),
		ID:          newCommandID(),
		Retain:      s.opts.CommandRetention,
	})
	if err != nil {
		return Command{}, s.commandFailed(ctx, b, err)
	}
	return cmd, nil
}

// Commands lists the durable commands of sandbox id (one-shot execs'
// too), oldest first.
func (s *Service) Commands(ctx context.Context, c Caller, id string) ([]Command, error) {
	ag, b, end, err := s.agentHost(ctx, c, id, "durable commands", nil)
	if err != nil {
		return nil, err
	}
	defer end()
	list, err := ag.Commands(ctx)
	if err != nil {
		return nil, s.commandFailed(ctx, b, err)
	}
	return list, nil
}

// Command describes command cid of sandbox id: ErrNotFound for an id the
// agent does not hold (or an ill-formed one).
func (s *Service) Command(ctx context.Context, c Caller, id, cid string) (Command, error) {
	ag, b, end, err := s.commandHost(ctx, c, id, cid)
	if err != nil {
		return Command{}, err
	}
	defer end()
	cmd, err := ag.Command(ctx, cid)
	if err != nil {
		return Command{}, s.commandFailed(ctx, b, err)
	}
	return cmd, nil
}

// WaitCommand waits up to timeout (nil: DefaultCommandWait; at most
// MaxCommandWait) for command cid to end. Ended: its result, with its
// output as Exec returns it (each stream up to MaxExecOutput, Truncated
// when more was kept or produced; the caller must Release it). Still
// running when the timeout passed: the command (Running true) and a nil
// result. A broken connection to the sandbox is a result too, 125 and
// ExecSandbox, never an exit code the command did not return.
func (s *Service) WaitCommand(ctx context.Context, c Caller, id, cid string, timeout *time.Duration) (Command, *ExecResult, error) {
	wait := DefaultCommandWait
	if timeout != nil {
		if *timeout < 0 || *timeout > MaxCommandWait {
			return Command{}, nil, providers.InvalidFields{{Field: "timeout_s", Message: "must be between 0 and 300"}}
		}
		wait = *timeout
	}
	ag, b, end, err := s.commandHost(ctx, c, id, cid)
	if err != nil {
		return Command{}, nil, err
	}
	defer end()
	cmd, err := ag.WaitCommand(ctx, cid, wait)
	if err == nil && cmd.Running {
		return cmd, nil, nil
	}
	var res ExecResult
	if err == nil {
		res, err = s.commandResult(ctx, b, ag, cmd)
	}
	if err != nil {
		if k := providers.Kind(err); k == providers.ErrNotFound || k == providers.ErrInvalid {
			return Command{}, nil, err
		}
		res, err = s.execFailed(ctx, b, err)
		if err != nil {
			return Command{}, nil, err
		}
	}
	return cmd, &res, nil
}

// errEnough stops a read of output once as much was read as is kept.
var errEnough = errors.New("enough output")

// commandResult is ended command cmd as an exec's result: its output read
// back from its agent up to the exec output cap, which the result holds
// in the output budget until released.
func (s *Service) commandResult(ctx context.Context, b *box, ag *agentclient.Client, cmd Command) (ExecResult, error) {
	maxOut, room := s.out.reserve(b.rec.Creator, s.opts.MaxExecOutput)
	out := [2][]byte{{}, {}}
	var want [2]int64
	_, err := ag.ReadCommand(ctx, cmd.ID, 0, 0, false, func(at Command) error {
		want = [2]int64{min(at.StdoutSize, int64(maxOut)), min(at.StderrSize, int64(maxOut))}
		return nil
	}, func(o Output) error {
		i := 0
		if !o.Stdout {
			i = 1
		}
		if n := want[i] - int64(len(out[i])); n > 0 {
			out[i] = append(out[i], o.Data[:min(int64(len(o.Data)), n)]...)
		}
		if int64(len(out[0])) == want[0] && int64(len(out[1])) == want[1] {
			return errEnough
		}
		return nil
	})
	if err != nil && !errors.Is(err, errEnough) {
		room.release()
		return ExecResult{}, err
	}
	room.keep(int64(len(out[0]) + len(out[1])))
	res := ExecResult{
		Stdout: out[0], Stderr: out[1],
		Duration:  time.Duration(cmd.DurationUS) * time.Microsecond,
		Truncated: cmd.Truncated || cmd.StdoutSize > int64(maxOut) || cmd.StderrSize > int64(maxOut),
		Usage: &providers.ExecUsage{
			CPUTime:    time.Duration(cmd.CPUTimeUS) * time.Microsecond,
			PeakMemory: cmd.PeakRSS,
			OOMKilled:  cmd.OOMKilled,
		},
		release: room.release,
	}
	if cmd.ExitCode != nil {
		res.ReturnCode = *cmd.ExitCode
	}
	if cmd.TimedOut {
		res.ReturnCode, res.ErrorType = 125, ExecTimeout
	}
	return res, nil
}

// ReadCommand reads command cid's output from offset since[0] of stdout
// and since[1] of stderr, as agentclient.Client.ReadCommand does: start
// is called once with the command as it was when the read began, chunk
// with each piece; without follow the read ends at start's sizes, with
// follow it returns the command as it ended once all its output was read.
// A negative offset, or one beyond its stream's end, is ErrInvalid. An
// error from start or chunk ends the read and is returned as it is.
func (s *Service) ReadCommand(ctx context.Context, c Caller, id, cid string, since [2]int64, follow bool,
	start func(Command) error, chunk func(Output) error) (Command, error) {
	if since[0] < 0 || since[1] < 0 {
		return Command{}, providers.InvalidFields{{Field: "since", Message: "must not be negative"}}
	}
	ag, b, end, err := s.commandHost(ctx, c, id, cid)
	if err != nil {
		return Command{}, err
	}
	defer end()
	var theirs bool // the error is start's or chunk's
	cmd, err := ag.ReadCommand(ctx, cid, since[0], since[1], follow, func(cmd Command) error {
		err := start(cmd)
		theirs = err != nil
		return err
	}, func(o Output) error {
		err := chunk(o)
		theirs = err != nil
		return err
	})
	if err != nil && !theirs {
		return Command{}, s.commandFailed(ctx, b, err)
	}
	return cmd, err
}

// ReadCommandStream reads one stream of command cid (stdout, else
// stderr) from offset since to its end when the read begins, as
// ReadCommand does without follow: start gets the command as it was then
// (the end is its size of that stream), chunk the stream's pieces.
func (s *Service) ReadCommandStream(ctx context.Context, c Caller, id, cid string, stdout bool, since int64,
	start func(Command) error, chunk func(Output) error) (Command, error) {
	// The agent reads both streams: the other one is asked from its end
	// as it is now, and what it gains meanwhile is dropped.
	cmd, err := s.Command(ctx, c, id, cid)
	if err != nil {
		return Command{}, err
	}
	from := [2]int64{since, cmd.StderrSize}
	if !stdout {
		from = [2]int64{cmd.StdoutSize, since}
	}
	return s.ReadCommand(ctx, c, id, cid, from, false, start, func(o Output) error {
		if o.Stdout != stdout {
			return nil
		}
		return chunk(o)
	})
}

// SignalCommand sends signal sig (a name of wire.Signals, else
// ErrInvalid) to command cid's process group.
func (s *Service) SignalCommand(ctx context.Context, c Caller, id, cid, sig string) error {
	n, ok := wire.Signals[sig]
	if !ok {
		return providers.InvalidFields{{Field: "signal", Message: "must be one of SIGINT, SIGTERM, SIGKILL, SIGQUIT, SIGHUP"}}
	}
	ag, b, end, err := s.commandHost(ctx, c, id, cid)
	if err != nil {
		return err
	}
	defer end()
	if err := ag.SignalCommand(ctx, cid, int(n)); err != nil {
		return s.commandFailed(ctx, b, err)
	}
	return nil
}

// DeleteCommand kills command cid's process tree if it still runs, then
// forgets it and its output.
func (s *Service) DeleteCommand(ctx context.Context, c Caller, id, cid string) error {
	ag, b, end, err := s.commandHost(ctx, c, id, cid)
	if err != nil {
		return err
	}
	defer end()
	if err := ag.DeleteCommand(ctx, cid); err != nil {
		return s.commandFailed(ctx, b, err)
	}
	return nil
}

// commandHost is agentHost for a call about command cid: an ill-formed
// cid is ErrNotFound once the caller is authorised, without asking the
// agent.
func (s *Service) commandHost(ctx context.Context, c Caller, id, cid string) (*agentclient.Client, *box, func(), error) {
	return s.agentHost(ctx, c, id, "durable commands", func() error {
		if !validCommandID(cid) {
			return providers.Errorf(providers.ErrNotFound, "sandbox %s has no command %q", id, wire.Truncate(cid, 40))
		}
		return nil
	})
}

// agentHost authorises c to operate sandbox id, which must be running,
// checks the request with check (nil: none), marks a request in flight on
// the sandbox (end, which the caller must call, ends it) and returns the
// connection to its agent. ErrUnsupported, naming what, when the provider
// runs no agent.
func (s *Service) agentHost(ctx context.Context, c Caller, id, what string, check func() error) (*agentclient.Client, *box, func(), error) {
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return nil, nil, nil, err
	}
	ap, ok := s.p.(agentclient.Provider)
	if !ok {
		return nil, nil, nil, providers.Errorf(providers.ErrUnsupported, "%s are not supported by provider %s", what, s.p.Name())
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, nil, nil, err
		}
	}
	end, err := s.begin(a.box)
	if err != nil {
		return nil, nil, nil, err
	}
	ag, err := ap.Agent(ctx, id)
	if err != nil {
		end()
		return nil, nil, nil, err
	}
	return ag, a.box, end, nil
}

// commandFailed is err, from sandbox b's agent, as the client gets it:
// the client's own cancellation, invalid input, an unknown command and a
// limit pass through; a sandbox known to be gone is ErrConflict; a broken
// connection is ErrUnavailable.
func (s *Service) commandFailed(ctx context.Context, b *box, err error) error {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return err
	}
	switch providers.Kind(err) {
	case providers.ErrInvalid, providers.ErrNotFound, providers.ErrTooMany:
		return err
	}
	s.refresh(context.WithoutCancel(ctx), b)
	s.mu.Lock()
	state, why := b.rec.State, b.rec.StateReason
	s.mu.Unlock()
	if state != providers.StateRunning {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is %s%s", b.rec.ID, state, reason(why))
	}
	if providers.Kind(err) == nil {
		s.log.Warn("command: the sandbox's agent failed", "sandbox", b.rec.ID, "err", err)
		return providers.Wrap(providers.ErrUnavailable, err, "the sandbox's agent did not answer; retry")
	}
	return err
}
