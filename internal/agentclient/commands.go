package agentclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// Command is a durable command as its agent describes it.
type Command = agentwire.CommandInfo

// CommandRequest starts a durable command: the exec request (checked as
// Exec checks it), the id the gateway chose and how long the agent keeps
// the command after it ends.
type CommandRequest struct {
	providers.ExecRequest
	ID     string
	Retain time.Duration
}

// StartCommand starts a durable command and returns once it runs. A
// command that cannot start (an unknown user, a missing cwd) is
// ErrInvalid, and nothing is kept.
func (c *Client) StartCommand(ctx context.Context, req CommandRequest) (Command, error) {
	er, err := durable(req)
	if err != nil {
		return Command{}, err
	}
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpCmdStart, Exec: er})
	if err != nil {
		return Command{}, err
	}
	return c.command(rep, req.ID)
}

// durable is req on the wire, checked.
func durable(req CommandRequest) (*agentwire.ExecRequest, error) {
	if req.ID == "" {
		return nil, providers.Errorf(providers.ErrInvalid, "a durable command needs an id")
	}
	r, err := req.ExecRequest.Check()
	if err != nil {
		return nil, err
	}
	er := wireExec(r)
	er.ID, er.RetainMS = req.ID, req.Retain.Milliseconds()
	return er, nil
}

// wireExec is r on the wire.
func wireExec(r providers.ExecRequest) *agentwire.ExecRequest {
	return &agentwire.ExecRequest{
		Command: r.Command, Cwd: r.Cwd, Env: r.Env, TimeoutMS: r.Timeout.Milliseconds(),
		User: r.User, Stdin: r.Stdin, HasStdin: r.Stdin != nil,
		PreserveBackground: r.PreserveBackground, MaxOutput: r.MaxOutput,
	}
}

// command is the reply's command, which must be id's: anything else is a
// lie.
func (c *Client) command(rep agentwire.Reply, id string) (Command, error) {
	if rep.Command == nil || rep.Command.ID != id {
		return Command{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("a reply that does not describe command %q", id)})
	}
	return *rep.Command, nil
}

// Commands lists the commands the agent holds, oldest first.
func (c *Client) Commands(ctx context.Context) ([]Command, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpCmdList})
	return rep.Commands, err
}

// Command describes command id: ErrNotFound if the agent holds none.
func (c *Client) Command(ctx context.Context, id string) (Command, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpCmdGet, ID: id})
	if err != nil {
		return Command{}, err
	}
	return c.command(rep, id)
}

// WaitCommand waits up to timeout for command id to end and describes
// it: Running is still true when the timeout passed first.
func (c *Client) WaitCommand(ctx context.Context, id string, timeout time.Duration) (Command, error) {
	rep, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpCmdWait, ID: id, TimeoutMS: max(timeout.Milliseconds(), 1)})
	if err != nil {
		return Command{}, err
	}
	return c.command(rep, id)
}

// SignalCommand sends sig to command id's process group.
func (c *Client) SignalCommand(ctx context.Context, id string, sig int) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpCmdSignal, ID: id, Signal: sig})
	return err
}

// DeleteCommand kills command id's tree (if it still runs) and forgets it
// and its output.
func (c *Client) DeleteCommand(ctx context.Context, id string) error {
	_, err := c.simple(ctx, agentwire.Request{Op: agentwire.OpCmdDelete, ID: id})
	return err
}

// Output is a command's output as it is read: chunks of stdout and
// stderr, each contiguous from the offsets asked for.
type Output struct {
	Stdout bool   // false: stderr
	Offset int64  // of Data's first byte in its stream
	Data   []byte // valid until the next chunk
}

// ReadCommand reads command id's output from offset since of stdout and
// sinceErr of stderr. It calls start once with the command as it was when
// the read began (whose sizes are where a read without follow ends), then
// chunk with each piece of output, in the order the agent sends them.
// Without follow it returns at those sizes; with follow it goes on as the
// command writes, and returns the command as it ended once it ended and
// all its output was read. An offset beyond its stream's end is
// ErrInvalid. The agent's offsets are checked: output beyond the sizes it
// announced, or past MaxOutput, is a lie.
func (c *Client) ReadCommand(ctx context.Context, id string, since, sinceErr int64, follow bool,
	start func(Command) error, chunk func(Output) error) (Command, error) {
	rep, st, err := c.call(ctx, agentwire.Request{Op: agentwire.OpCmdRead, ID: id, Since: since, SinceErr: sinceErr, Follow: follow})
	if err != nil {
		return Command{}, err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	cmd, err := c.command(rep, id)
	if err != nil {
		return Command{}, err
	}
	if err := start(cmd); err != nil {
		return Command{}, err
	}
	off := [2]int64{since, sinceErr}
	end := [2]int64{cmd.StdoutSize, cmd.StderrSize}
	if follow {
		end = [2]int64{cmd.MaxOutput, cmd.MaxOutput}
	}
	var buf []byte
	for {
		typ, p, err := agentwire.ReadFrame(st, buf)
		if err != nil {
			if ctx.Err() != nil {
				return Command{}, ctx.Err()
			}
			if !follow && errors.Is(err, io.EOF) && off == [2]int64{cmd.StdoutSize, cmd.StderrSize} {
				return cmd, nil
			}
			return Command{}, c.fail(fmt.Errorf("read command %s: %w", id, err))
		}
		buf = p[:0]
		switch typ {
		case agentwire.FrameStdout, agentwire.FrameStderr:
			i := 0
			if typ == agentwire.FrameStderr {
				i = 1
			}
			if off[i]+int64(len(p)) > end[i] {
				return Command{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("command %s output beyond its end (%d)", id, end[i])})
			}
			if err := chunk(Output{Stdout: i == 0, Offset: off[i], Data: p}); err != nil {
				return Command{}, err
			}
			off[i] += int64(len(p))
		case agentwire.FrameExit:
			var fin Command
			if err := json.Unmarshal(p, &fin); err != nil || fin.ID != id || fin.Running {
				return Command{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("command %s: an exit frame that is not its final state", id)})
			}
			if !follow || off != [2]int64{fin.StdoutSize, fin.StderrSize} {
				return Command{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("command %s ended at offsets %d/%d, not at the %d/%d sent", id, fin.StdoutSize, fin.StderrSize, off[0], off[1])})
			}
			return fin, nil
		default:
			return Command{}, c.violate(&agentwire.ProtocolError{What: fmt.Sprintf("frame %q on a command read", typ)})
		}
	}
}
