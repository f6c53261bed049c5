package local

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

const (
	// killGrace bounds the wait for the exit report once the command was
	// killed; past it (the agent is frozen or gone) Exec returns anyway.
	killGrace = 5 * time.Second
	// drainGrace is how long output is still read after the command
	// exited while something it left behind keeps the pipes open.
	drainGrace        = 100 * time.Millisecond
	drainGraceCleaned = 2 * time.Second // after cleanup killed the leftovers: EOF is imminent
)

// Exec runs req.Command in the sandbox with bash -c (sh -c if the sandbox
// has no /bin/bash), as its own session and process group. See
// providers.ExecRequest for the semantics. ErrConflict if the sandbox is
// paused or stopped, ErrInvalid for a bad request or a command that cannot
// start (unknown user, missing cwd); any other error means the sandbox's
// agent failed.
func (l *Local) Exec(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	sb, err := l.running(id)
	if err != nil {
		return providers.ExecResult{}, err
	}
	if req.Timeout < 0 {
		return providers.ExecResult{}, providers.Errorf(providers.ErrInvalid, "timeout must be positive")
	}
	if req.Timeout == 0 {
		req.Timeout = providers.DefaultExecTimeout
	}
	if req.MaxOutput <= 0 {
		req.MaxOutput = providers.DefaultMaxOutput
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = sb.st.Workdir
	}
	if !filepath.IsAbs(cwd) {
		return providers.ExecResult{}, providers.Errorf(providers.ErrInvalid, "cwd must be absolute")
	}
	if err := validateEnv(req.Env); err != nil {
		return providers.ExecResult{}, providers.Errorf(providers.ErrInvalid, "%v", err)
	}
	if strings.ContainsRune(req.Command, 0) {
		return providers.ExecResult{}, providers.Errorf(providers.ErrInvalid, "command contains a NUL byte")
	}
	return sb.exec(ctx, request{
		Op:       opExec,
		Command:  req.Command,
		Env:      envList(sb.st.Env, req.Env),
		Dir:      sb.hostPath(filepath.Clean(cwd)),
		User:     req.User,
		Preserve: req.PreserveBackground,
	}, req)
}

// execRun is the gateway's half of one command: the pipes, the connection
// to the agent and the goroutines that serve them. Every goroutine is
// joined before exec returns.
type execRun struct {
	conn    *net.UnixConn
	replies chan agentReply
	stdout  capture
	stderr  capture
	outR    *os.File
	errR    *os.File
	inW     *os.File // nil without stdin bytes
	wg      sync.WaitGroup
	leader  *os.File // pidfd of the command, once started; closed by exec
	killed  bool
}

func (sb *sandbox) exec(ctx context.Context, req request, pr providers.ExecRequest) (providers.ExecResult, error) {
	start := time.Now()
	ooms := sb.oomKills()
	r := &execRun{replies: make(chan agentReply, 2)}
	r.stdout.max, r.stderr.max = pr.MaxOutput, pr.MaxOutput

	// The child's ends of the pipes are ours to close once sent.
	var childFiles []*os.File
	defer func() { closeFiles(childFiles) }()
	var err error
	var outW, errW, inR *os.File
	if r.outR, outW, err = os.Pipe(); err != nil {
		return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", sb.id, err)
	}
	childFiles = append(childFiles, outW)
	defer r.outR.Close()
	if r.errR, errW, err = os.Pipe(); err != nil {
		return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", sb.id, err)
	}
	childFiles = append(childFiles, errW)
	defer r.errR.Close()
	if pr.Stdin != nil {
		if inR, r.inW, err = os.Pipe(); err != nil {
			return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", sb.id, err)
		}
		defer r.inW.Close()
	} else if inR, err = os.Open(os.DevNull); err != nil {
		return providers.ExecResult{}, fmt.Errorf("exec in %s: %w", sb.id, err)
	}
	childFiles = append(childFiles, inR)

	if r.conn, err = sb.dial(ctx); err != nil {
		if ctx.Err() != nil {
			return providers.ExecResult{}, ctx.Err()
		}
		return providers.ExecResult{}, fmt.Errorf("exec in %s: connect to agent: %w", sb.id, err)
	}
	defer r.conn.Close()
	if err := sendMsg(r.conn, req, inR, outW, errW); err != nil {
		return providers.ExecResult{}, fmt.Errorf("exec in %s: send to agent: %w", sb.id, err)
	}
	closeFiles(childFiles)
	childFiles = nil

	r.wg.Add(3)
	go r.readReplies()
	go func() { defer r.wg.Done(); r.stdout.readFrom(r.outR) }()
	go func() { defer r.wg.Done(); r.stderr.readFrom(r.errR) }()
	if r.inW != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.inW.Write(pr.Stdin) // EPIPE when the command does not read it all: fine
			r.inW.Close()
		}()
	}

	res, err := r.wait(ctx, sb, pr.Timeout)
	r.finish(res.exited && !pr.PreserveBackground || r.killed)
	if r.leader != nil {
		r.leader.Close()
	}
	if err != nil {
		return providers.ExecResult{}, err
	}
	out := providers.ExecResult{
		Stdout:    r.stdout.buf,
		Stderr:    r.stderr.buf,
		ExitCode:  res.code,
		TimedOut:  res.timedOut,
		Truncated: r.stdout.truncated || r.stderr.truncated,
		Duration:  time.Since(start),
	}
	oom := out.ExitCode == 128+int(unix.SIGKILL) && sb.oomKills() > ooms
	if res.timedOut {
		out.ExitCode = 125
	}
	if res.exited {
		out.Usage = &providers.ExecUsage{CPUTime: res.exit.CPU, PeakMemory: res.exit.MaxRSS, OOMKilled: oom}
		if res.exit.Ran > 0 {
			out.Duration = res.exit.Ran // measured inside: no gateway or transport time
		}
	}
	if oom {
		out.Stderr = append(out.Stderr, fmt.Sprintf("\nsandgate: killed: out of memory (the sandbox's memory limit is %d MiB)\n", sb.memoryLimit()>>20)...)
	}
	return out, nil
}

// oomKills is how many processes the kernel has killed in the sandbox for
// want of memory (0 without a memory cgroup).
func (sb *sandbox) oomKills() int64 {
	dir := sb.st.Cgroups["memory"]
	if dir == "" {
		return 0
	}
	b, _ := os.ReadFile(dir + "/memory.oom_control")
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// memoryLimit is the sandbox's memory limit in bytes.
func (sb *sandbox) memoryLimit() int64 {
	b, _ := os.ReadFile(sb.st.Cgroups["memory"] + "/memory.limit_in_bytes")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// agentReply is a reply with, for the first, the command's pidfd.
type agentReply struct {
	reply
	pidfd *os.File
}

type waitResult struct {
	exited   bool
	code     int
	timedOut bool
	exit     reply // the agent's exit report, with the accounting
}

// wait follows the agent's replies until the command exits, killing it on
// timeout or cancellation.
func (r *execRun) wait(ctx context.Context, sb *sandbox, timeout time.Duration) (waitResult, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var (
		res   waitResult
		grace <-chan time.Time
	)
	done := ctx.Done()
	for {
		select {
		case m, ok := <-r.replies:
			if !ok {
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				if res.timedOut {
					return res, nil
				}
				if s := sb.state(); s != providers.StateRunning {
					return res, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", sb.id, s)
				}
				return res, fmt.Errorf("exec in %s: agent closed the connection", sb.id)
			}
			switch {
			case m.Error != "":
				msg := sb.clientMsg(m.Error)
				if m.Kind == kindInvalid {
					return res, providers.Errorf(providers.ErrInvalid, "%s", msg)
				}
				return res, fmt.Errorf("exec in %s: %s", sb.id, msg)
			case m.Exited:
				res.exited, res.code, res.exit = true, m.Code, m.reply
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				return res, nil
			case m.Pid > 0:
				r.leader = m.pidfd
				if r.killed {
					r.kill()
				}
			}
		case <-timer.C:
			res.timedOut = true
			r.kill()
			grace = time.After(killGrace)
		case <-done:
			done = nil
			r.kill()
			grace = time.After(killGrace)
		case <-grace:
			if ctx.Err() != nil {
				return res, ctx.Err()
			}
			return res, nil
		}
	}
}

// kill has the agent kill the command's group, session and descendants,
// and kills the command itself from here through its pidfd, which works
// even when the agent is stuck. Never by pid number: a number can be
// reused, a pidfd cannot.
func (r *execRun) kill() {
	r.killed = true
	sendMsg(r.conn, request{Op: opKill})
	if r.leader != nil {
		unix.PidfdSendSignal(int(r.leader.Fd()), unix.SIGKILL, nil, 0)
	}
}

// readReplies forwards the agent's messages to r.replies and closes it at
// EOF. The pidfd that comes with the first reply is turned into the host
// pid before the reply is forwarded.
func (r *execRun) readReplies() {
	defer r.wg.Done()
	defer close(r.replies)
	for {
		var m agentReply
		files, err := recvMsg(r.conn, &m.reply)
		if len(files) > 0 && m.Pid > 0 {
			m.pidfd, files = files[0], files[1:]
		}
		closeFiles(files)
		if err != nil {
			return
		}
		r.replies <- m
		if m.Exited || m.Error != "" {
			return
		}
	}
}

// finish stops the goroutines and waits for them. Output still in the
// pipes is read until EOF or a grace period, whichever comes first: a
// process the command left running may hold the pipes open forever.
func (r *execRun) finish(cleaned bool) {
	r.conn.SetReadDeadline(time.Now())
	grace := drainGrace
	if cleaned {
		grace = drainGraceCleaned
	}
	dl := time.Now().Add(grace)
	r.outR.SetReadDeadline(dl)
	r.errR.SetReadDeadline(dl)
	if r.inW != nil {
		r.inW.Close()
	}
	r.wg.Wait()
}

// capture keeps the first max bytes of a stream and discards the rest,
// reading on so that the writer never blocks.
type capture struct {
	buf       []byte
	max       int
	truncated bool
}

func (c *capture) readFrom(f *os.File) {
	b := make([]byte, 32<<10)
	for {
		n, err := f.Read(b)
		if n > 0 {
			room := c.max - len(c.buf)
			if n > room {
				c.truncated = true
				n = max(room, 0)
			}
			c.buf = append(c.buf, b[:n]...)
		}
		if err != nil {
			if c.buf == nil {
				c.buf = []byte{}
			}
			return
		}
	}
}
