package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
)

// execSeq numbers the commands of this agent: with the pid it makes each
// command's marker unique.
var execSeq atomic.Int64

// drainGrace bounds how long a command's output is awaited after its tree
// is gone (or, with background processes preserved, after it returned).
const drainGrace = 250 * time.Millisecond

// runExec runs one command and streams its output through emit (stdout
// and stderr frames, each stream capped at MaxOutput), then returns the
// result. cancelled ends it early: the tree is killed and the result is
// not wanted. A start failure is the result's Error.
func (s *Server) runExec(req agentwire.ExecRequest, emit func(typ byte, p []byte) error, cancelled <-chan struct{}) agentwire.ExecResult {
	if req.MaxOutput <= 0 {
		req.MaxOutput = providers.DefaultMaxOutput
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 {
		timeout = providers.DefaultExecTimeout
	}
	argv, err := shellArgs(req.Command)
	if err != nil {
		return agentwire.ExecResult{Error: providers.Message(err), Kind: agentwire.KindOf(err)}
	}
	cmd, err := s.command(argv, req.User, req.Cwd, req.Env)
	if err != nil {
		return agentwire.ExecResult{Error: providers.Message(err), Kind: agentwire.KindOf(err)}
	}
	marker := "SANDGATE_EXEC=" + strconv.Itoa(os.Getpid()) + "." + strconv.FormatInt(execSeq.Add(1), 10)
	cmd.Env = append(cmd.Env, marker)
	cmd.SysProcAttr.Setsid = true // its own session and group: pgid = pid
	var stdin *os.File            // the write end of stdin's pipe, fed below
	if req.HasStdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			return agentwire.ExecResult{Error: err.Error()}
		}
		cmd.Stdin, stdin = inR, inW
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return agentwire.ExecResult{Error: err.Error()}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return agentwire.ExecResult{Error: err.Error()}
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	ooms := oomKills()
	start := time.Now()
	waited, err := s.spawn(cmd, cmd.Start, !req.PreserveBackground)
	outW.Close()
	errW.Close()
	if stdin != nil {
		cmd.Stdin.(*os.File).Close() // the child's end
	}
	if err != nil {
		outR.Close()
		errR.Close()
		if stdin != nil {
			stdin.Close()
		}
		return agentwire.ExecResult{Error: fmt.Sprintf("start %s: %v", cmd.Path, err)}
	}
	defer cmd.Process.Release()
	pid := cmd.Process.Pid
	if stdin != nil {
		go func() {
			stdin.Write(req.Stdin) // fails once the command is gone: fine
			stdin.Close()
		}()
	}

	var truncated atomic.Bool
	var wg sync.WaitGroup
	stopFwd := make(chan struct{})
	// The output is kept here, up to the cap, and sent with the result:
	// the command's pipes drain at their own pace whatever the connection
	// to the gateway does (a sandbox at its pids limit can starve it).
	var outMu sync.Mutex
	kept := [2][]byte{}
	forward := func(r *os.File, i int) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				outMu.Lock()
				select {
				case <-stopFwd: // past the drain: discard until the last holder exits
				default:
					keep := min(n, req.MaxOutput-len(kept[i]))
					if keep < n {
						truncated.Store(true)
					}
					kept[i] = append(kept[i], buf[:keep]...)
				}
				outMu.Unlock()
			}
			if err != nil {
				r.Close()
				return
			}
		}
	}
	wg.Add(2)
	go forward(outR, 0)
	go forward(errR, 1)
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
		if !req.PreserveBackground {
			s.reaper.sweep(0, marker)
		}
	case <-timer.C:
		res.TimedOut = true
		s.reaper.sweep(pid, marker)
		st = <-waited
	case <-cancelled:
		s.reaper.sweep(pid, marker)
		st = <-waited
	}
	ran := time.Since(start)
	t := time.NewTimer(drainGrace)
	select {
	case <-drained:
	case <-t.C:
		close(stopFwd) // leftovers hold the pipes: stop forwarding, keep draining
	}
	t.Stop()

	outMu.Lock()
	for i, typ := range []byte{agentwire.FrameStdout, agentwire.FrameStderr} {
		for p := kept[i]; len(p) > 0; {
			n := min(len(p), agentwire.MaxFrame)
			emit(typ, p[:n])
			p = p[n:]
		}
	}
	outMu.Unlock()
	res.ExitCode = st.Code()
	res.Truncated = truncated.Load()
	res.DurationUS = ran.Microseconds()
	res.CPUTimeUS = (time.Duration(st.Usage.Utime.Nano()) + time.Duration(st.Usage.Stime.Nano())).Microseconds()
	res.PeakRSS = st.Usage.Maxrss << 10
	res.OOMKilled = res.ExitCode == 128+int(syscall.SIGKILL) && oomKills() > ooms
	if res.TimedOut {
		res.ExitCode = 125
	}
	if res.OOMKilled {
		emit(agentwire.FrameStderr, []byte("\nsandgate: killed: out of memory (the sandbox's memory limit)\n"))
	}
	return res
}

// oomKills is how many processes the kernel has killed for want of memory
// in the sandbox's cgroup (0 when the agent cannot tell).
func oomKills() int64 { return procfs.OOMKills("/sys/fs/cgroup/memory.events") }

// execOverStream serves an exec stream: it runs the command, forwards its
// output as frames and ends with the result frame. The gateway closing
// its side of the stream cancels the command.
func (s *Server) execOverStream(st io.ReadWriteCloser, req agentwire.ExecRequest) {
	cancelled := make(chan struct{})
	go func() {
		io.Copy(io.Discard, st)
		close(cancelled)
	}()
	res := s.runExec(req, func(typ byte, p []byte) error { return agentwire.WriteFrame(st, typ, p) }, cancelled)
	b, _ := json.Marshal(res)
	agentwire.WriteFrame(st, agentwire.FrameResult, b)
}
