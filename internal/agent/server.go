// Package agent is sandgate's in-sandbox agent: the server end of the
// one data plane of every provider (the wire is package agentwire, the
// gateway's end package agentclient). The agent is the only thing that
// runs inside a sandbox on the gateway's behalf. It runs one-shot
// commands (their whole tree killed at a timeout, a cancel, or when they
// return unless background processes are preserved), reads and writes
// files with the sandbox's own credentials, and holds terminal sessions:
// their processes and retained output, so that a session outlives the
// gateway that started it.
package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
)

// Server is the agent's side of the protocol: it serves connections and
// holds the terminal sessions, which outlive any one connection.
type Server struct {
	version string // the protocol it speaks: Version
	reaper  *Reaper
	own     bool // the reaper is the server's: Close stops it
	opts    Options

	meter *meter // the metrics op's samples

	mu       sync.Mutex // guards sessions, commands and cmdSeq
	sessions map[string]*session
	commands map[string]*command // the durable ones, by id
	cmdSeq   int64

	wl         watchLimits   // the directory watches (watch.go)
	grownPipes atomic.Int32  // sessions' output pipes grown to streamPipe now (see growPipe)
	stallAfter time.Duration // of the sessions started from now (see throttle); tests change it
}

// Options adapt a server to the process it runs in.
type Options struct {
	// ForkOn runs fn on the thread every fork must happen on (a local
	// sandbox's init forks on a thread under its seccomp filter); nil:
	// wherever the caller runs.
	ForkOn func(fn func())
	// Env is the environment commands start from (the sandbox's); nil:
	// the agent's own.
	Env []string
	// Workdir is where a command without a cwd runs; "": the agent's.
	Workdir string
	// Root prefixes every path a command's cwd names (a local sandbox
	// without namespaces lives in a directory of the host); "": none.
	Root string
	// Files, if set, opens, describes and lists files in place of the
	// agent's own lookups, on the ForkOn thread; with it the agent also
	// serves the open op, which hands the opened file itself to a
	// gateway on a unix socket (a local sandbox's init).
	Files Files
	// Forker is the ForkOn thread's id, told to the gateway in the hello
	// (0: none).
	Forker int
	// OOMKills counts the processes the kernel killed for want of memory
	// in the sandbox (nil: the agent reads cgroup v2's memory.events);
	// MemoryLimit is the sandbox's limit in bytes, for the note a killed
	// command's stderr gets (0: unknown).
	OOMKills    func() int64
	MemoryLimit int64
	// PIDNamespace says the agent is its sandbox's PID 1, so that
	// kill(-1) reaches the sandbox's processes and nothing else: the
	// signal_all op needs it.
	PIDNamespace bool
	// Cgroup is the sandbox's cgroup the metrics op reads, which the
	// server then owns (nil: what the agent sees at /sys/fs/cgroup,
	// opened at the first metrics op).
	Cgroup *Cgroup
}

// Files is a sandbox's filesystem as a local sandbox's init serves it
// (see Options.Files). Errors carry their kind and a message for the
// gateway's client.
type Files interface {
	// Open opens the regular file at the absolute path p for reading, or
	// for writing: created (with missing parents) and truncated.
	Open(p string, write bool) (*os.File, error)
	// Stat describes p as lstat does.
	Stat(p string) (providers.FileInfo, error)
	// List describes the entries of the directory p (see ReadDir).
	List(p string) ([]providers.FileInfo, bool, error)
	// Dir opens the directory at the absolute path p for reading (a
	// watch's root): ErrInvalid if it is not a directory.
	Dir(p string) (*os.File, error)
	// Spill opens an unlinked file on the sandbox's disk for reading and
	// writing (see SpillFile): where a command's output overflows.
	Spill() (*os.File, error)
}

// NewServer returns a server with a reaper of its own. With subreaper it
// becomes the subreaper of what it starts (the agent binary; a test in
// its own process passes false).
func NewServer(subreaper bool) *Server {
	s := NewServerWith(NewReaper(subreaper), Options{})
	s.own = true
	return s
}

// NewServerWith returns a server whose commands r reaps (a local
// sandbox's init, which reaps everything as the sandbox's PID 1).
func NewServerWith(r *Reaper, o Options) *Server {
	if o.ForkOn == nil {
		o.ForkOn = func(fn func()) { fn() }
	}
	if o.OOMKills == nil {
		o.OOMKills = func() int64 { return procfs.OOMKills("/sys/fs/cgroup/memory.events") }
	}
	if o.Env == nil {
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SANDGATE_AGENT") {
				o.Env = append(o.Env, kv)
			}
		}
	}
	m := &meter{start: time.Now(), root: "/", open: openOwnCgroup, cg: o.Cgroup}
	if o.Root != "" {
		m.root = o.Root
	}
	return &Server{version: agentwire.Version, reaper: r, opts: o, meter: m, sessions: map[string]*session{}, commands: map[string]*command{}, wl: defaultWatchLimits(), stallAfter: stallAfter}
}

// spawn starts cmd with start (cmd.Start, or what wraps it) on the fork
// thread and returns the channel that gets its exit status (see
// Reaper.Start).
func (s *Server) spawn(cmd *exec.Cmd, start func() error, group bool) (<-chan ExitStatus, error) {
	var ch <-chan ExitStatus
	var err error
	s.opts.ForkOn(func() {
		ch, err = s.reaper.Start(func() (int, error) {
			if err := start(); err != nil {
				return 0, err
			}
			return cmd.Process.Pid, nil
		}, group)
	})
	return ch, err
}

// command prepares argv (see newCommand) with the server's options.
func (s *Server) command(argv []string, user, cwd string, env map[string]string) (*exec.Cmd, error) {
	if cwd == "" {
		cwd = s.opts.Workdir
	}
	if cwd != "" && s.opts.Root != "" {
		cwd = filepath.Clean("/" + cwd)
	}
	return newCommand(argv, user, cwd, s.opts.Root, env, s.opts.Env)
}

// Close kills every session's process and every command, and stops
// reaping.
func (s *Server) Close() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.sessions))
	for id := range s.sessions {
		ids = append(ids, id)
	}
	cmds := make([]*command, 0, len(s.commands))
	for _, c := range s.commands {
		cmds = append(cmds, c)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.deleteSession(id)
	}
	for _, c := range cmds {
		c.stop()
		s.drop(c)
	}
	s.closeWatchers()
	if s.own {
		s.reaper.Close()
	}
	s.meter.close()
}

// build describes this agent.
func build() string {
	return fmt.Sprintf("sandgate-agent protocol %s (%s)", agentwire.Version, runtime.Version())
}

// Serve serves one connection until it ends. shutdown, if not nil, is
// called on the shutdown op (tests kill an agent that way).
func (s *Server) Serve(conn io.ReadWriteCloser, shutdown func()) error {
	br := bufio.NewReaderSize(conn, 4<<10)
	if b, err := br.Peek(len(agentwire.DirectMagic)); err == nil && string(b) == agentwire.DirectMagic {
		// A direct connection: one call, no multiplexing (see WithDirect).
		br.Discard(len(agentwire.DirectMagic))
		uc, _ := conn.(*net.UnixConn)
		if uc != nil {
			// A direct connection carries one call, most often a terminal
			// attachment's output or a file. With the default send buffer
			// (~200 KiB) a pipe's frame (up to 1 MiB) went out in pieces,
			// each a wake-up of both ends; measured on the bench's 1 GiB
			// pipe stream, local, this took the ratio to direct from
			// 0.62-0.68 to 0.67-0.72. It is a bound, not an allocation;
			// the kernel caps it at net.core.wmem_max.
			uc.SetWriteBuffer(directSendBuffer)
		}
		s.handle(joined{br, conn}, uc, shutdown)
		return nil
	}
	ys, err := yamux.Server(&agentwire.FrameConn{ReadWriteCloser: joined{br, conn}}, agentwire.MuxConfig())
	if err != nil {
		return err
	}
	defer ys.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := ys.AcceptStream()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(st, nil, shutdown)
		}()
	}
}

// directSendBuffer is a direct connection's send buffer.
const directSendBuffer = 1 << 20

// joined reads through r and writes and closes c.
type joined struct {
	r io.Reader
	c io.ReadWriteCloser
}

func (j joined) Read(p []byte) (int, error)  { return j.r.Read(p) }
func (j joined) Write(p []byte) (int, error) { return j.c.Write(p) }
func (j joined) Close() error                { return j.c.Close() }

// handle serves one call on st; uc is the unix socket under a direct
// connection (nil on a stream), which can carry a descriptor.
func (s *Server) handle(st io.ReadWriteCloser, uc *net.UnixConn, shutdown func()) {
	defer st.Close()
	var req agentwire.Request
	if err := agentwire.ReadMsg(st, &req, agentwire.MaxRequest); err != nil {
		return
	}
	switch req.Op {
	case agentwire.OpHello:
		if req.Version != s.version {
			agentwire.WriteMsg(st, agentwire.Reply{Version: s.version, Agent: build(),
				Error: fmt.Sprintf("the gateway speaks agent protocol %s; this agent speaks %s (%s): run a gateway and agent of one release", req.Version, s.version, build())})
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{Version: s.version, Agent: build(), Forker: s.opts.Forker})
		return
	}
	switch req.Op {
	case agentwire.OpExec:
		if req.Exec == nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "exec without a command")))
			return
		}
		s.execCommand(st, *req.Exec)
	case agentwire.OpRead:
		f, size, err := s.openRead(req.Path)
		if err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		defer f.Close()
		if agentwire.WriteMsg(st, agentwire.Reply{Size: size}) == nil {
			// Exactly what was announced, though the file grew meanwhile:
			// the gateway takes more for a lie.
			io.CopyN(st, f, size)
		}
	case agentwire.OpWrite:
		n, err := s.writeTo(req.Path, st)
		if err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{Size: n})
	case agentwire.OpStat:
		fi, err := s.stat(req.Path)
		if err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{File: &fi})
	case agentwire.OpReadDir:
		files, truncated, err := s.list(req.Path)
		if err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, fitReply(agentwire.Reply{Files: files, Truncated: truncated}))
	case agentwire.OpStart:
		if req.Start == nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "session.start without a spec")))
			return
		}
		info, err := s.startSession(context.Background(), *req.Start)
		if err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{Session: &info})
	case agentwire.OpList:
		agentwire.WriteMsg(st, agentwire.Reply{Sessions: s.listSessions()})
	case agentwire.OpAttach:
		s.attach(st, req)
	case agentwire.OpDelete:
		if err := s.deleteSession(req.Session); err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{})
	case agentwire.OpCmdStart, agentwire.OpCmdList, agentwire.OpCmdGet, agentwire.OpCmdWait,
		agentwire.OpCmdRead, agentwire.OpCmdSignal, agentwire.OpCmdDelete:
		s.commandOp(st, req)
	case agentwire.OpWatch:
		s.watchDir(st, req)
	case agentwire.OpWatcherCreate, agentwire.OpWatcherEvents, agentwire.OpWatcherRemove:
		agentwire.WriteMsg(st, s.watcherOp(req))
	case agentwire.OpOpen:
		s.open(st, uc, req)
	case agentwire.OpSpawn:
		if req.Exec == nil || len(req.Exec.Argv) == 0 {
			agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrInvalid, "spawn without argv")))
			return
		}
		if err := s.spawnArgv(*req.Exec); err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{})
	case agentwire.OpSignalAll:
		if err := s.signalAll(req.Signal); err != nil {
			agentwire.WriteMsg(st, agentwire.ErrorReply(err))
			return
		}
		agentwire.WriteMsg(st, agentwire.Reply{})
	case agentwire.OpMetrics:
		agentwire.WriteMsg(st, agentwire.Reply{Metrics: s.meter.sample()})
	case agentwire.OpKillAll:
		killDescendants(os.Getpid())
		agentwire.WriteMsg(st, agentwire.Reply{})
	case agentwire.OpShutdown:
		agentwire.WriteMsg(st, agentwire.Reply{})
		if shutdown != nil {
			shutdown()
		}
	default:
		agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrUnsupported, "unknown op %q", req.Op)))
	}
}

// fitReply cuts a listing's entries until the reply fits maxReply (the
// gateway takes a longer one for a lie), marking it truncated.
func fitReply(rep agentwire.Reply) agentwire.Reply {
	for len(rep.Files) > 0 {
		b, err := json.Marshal(rep)
		if err != nil || len(b) <= agentwire.MaxReply {
			break
		}
		rep.Files, rep.Truncated = rep.Files[:len(rep.Files)*3/4], true
	}
	return rep
}
