package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/sandgate/sandgate/internal/providers"
)

// Server is the agent's side of the protocol: it serves connections and
// holds the terminal sessions, which outlive any one connection.
type Server struct {
	version string // the protocol it speaks: Version
	reaper  *Reaper
	own     bool // the reaper is the server's: Close stops it
	opts    Options
	start   Starter

	mu       sync.Mutex // guards sessions
	sessions map[string]*session
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
	if o.Env == nil {
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "SANDGATE_AGENT") {
				o.Env = append(o.Env, kv)
			}
		}
	}
	s := &Server{version: Version, reaper: r, opts: o, sessions: map[string]*session{}}
	s.start = s.startProcess
	return s
}

// NewHost returns a server whose sessions' processes start runs: a
// gateway hosting sessions in its own process for a provider without an
// agent.
func NewHost(start Starter) *Server {
	return &Server{version: Version, start: start, sessions: map[string]*session{}}
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

// command prepares cmdline (see newCommand) with the server's options.
func (s *Server) command(cmdline, user, cwd string, env map[string]string) (*exec.Cmd, error) {
	if cwd == "" {
		cwd = s.opts.Workdir
	}
	if cwd != "" && s.opts.Root != "" {
		cwd = filepath.Clean("/" + cwd)
	}
	return newCommand(cmdline, user, cwd, s.opts.Root, env, s.opts.Env)
}

// Close kills every session's process and stops reaping.
func (s *Server) Close() {
	s.mu.Lock()
	ids := make([]string, 0, len(s.sessions))
	for id := range s.sessions {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	for _, id := range ids {
		s.deleteSession(id)
	}
	if s.own {
		s.reaper.Close()
	}
}

func muxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.MaxStreamWindowSize = 1 << 20
	c.KeepAliveInterval = 10 * time.Second
	// How long a frame may wait to be sent (and a ping for its answer)
	// before the connection is declared dead: yamux's 10 s is too short on
	// an overloaded host, where a sandbox's agent can go that long without
	// a CPU (1,000 concurrent local rollouts on 2 cores lost executions
	// to it); a dead peer is found by the socket closing anyway.
	c.ConnectionWriteTimeout = time.Minute
	return c
}

// build describes this agent.
func build() string {
	return fmt.Sprintf("sandgate-agent protocol %s (%s)", Version, runtime.Version())
}

// Serve serves one connection until it ends. shutdown, if not nil, is
// called on the shutdown op (tests kill an agent that way).
func (s *Server) Serve(conn io.ReadWriteCloser, shutdown func()) error {
	br := bufio.NewReaderSize(conn, 4<<10)
	if b, err := br.Peek(len(directMagic)); err == nil && string(b) == directMagic {
		// A direct connection: one call, no multiplexing (see WithDirect).
		br.Discard(len(directMagic))
		s.handle(joined{br, conn}, shutdown)
		return nil
	}
	ys, err := yamux.Server(&frameConn{ReadWriteCloser: joined{br, conn}}, muxConfig())
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
			s.handle(st, shutdown)
		}()
	}
}

// joined reads through r and writes and closes c.
type joined struct {
	r io.Reader
	c io.ReadWriteCloser
}

func (j joined) Read(p []byte) (int, error)  { return j.r.Read(p) }
func (j joined) Write(p []byte) (int, error) { return j.c.Write(p) }
func (j joined) Close() error                { return j.c.Close() }

func (s *Server) handle(st io.ReadWriteCloser, shutdown func()) {
	defer st.Close()
	var req request
	if err := readMsg(st, &req, maxRequest); err != nil {
		return
	}
	switch req.Op {
	case opHello:
		if req.Version != s.version {
			writeMsg(st, reply{Version: s.version, Agent: build(),
				Error: fmt.Sprintf("the gateway speaks agent protocol %s; this agent speaks %s (%s): run a gateway and agent of one release", req.Version, s.version, build())})
			return
		}
		writeMsg(st, reply{Version: s.version, Agent: build()})
	case opExec, opRead, opWrite, opStat, opReadDir:
		if s.reaper == nil {
			writeMsg(st, errorReply(providers.Errorf(providers.ErrUnsupported, "this host runs terminal sessions only")))
			return
		}
	}
	switch req.Op {
	case opExec:
		if req.Exec == nil {
			writeMsg(st, errorReply(providers.Errorf(providers.ErrInvalid, "exec without a command")))
			return
		}
		if writeMsg(st, reply{}) == nil {
			s.execOverStream(st, *req.Exec)
		}
	case opRead:
		f, size, err := openRead(req.Path)
		if err != nil {
			writeMsg(st, errorReply(err))
			return
		}
		defer f.Close()
		if writeMsg(st, reply{Size: size}) == nil {
			// Exactly what was announced, though the file grew meanwhile:
			// the gateway takes more for a lie.
			io.CopyN(st, f, size)
		}
	case opWrite:
		n, err := writeTo(req.Path, st)
		if err != nil {
			writeMsg(st, errorReply(err))
			return
		}
		writeMsg(st, reply{Size: n})
	case opStat:
		fi, err := statPath(req.Path)
		if err != nil {
			writeMsg(st, errorReply(err))
			return
		}
		writeMsg(st, reply{File: &fi})
	case opReadDir:
		files, truncated, err := listPath(req.Path)
		if err != nil {
			writeMsg(st, errorReply(err))
			return
		}
		writeMsg(st, fitReply(reply{Files: files, Truncated: truncated}))
	case opStart:
		if req.Start == nil {
			writeMsg(st, errorReply(providers.Errorf(providers.ErrInvalid, "session.start without a spec")))
			return
		}
		info, err := s.startSession(context.Background(), *req.Start)
		if err != nil {
			writeMsg(st, errorReply(err))
			return
		}
		writeMsg(st, reply{Session: &info})
	case opList:
		writeMsg(st, reply{Sessions: s.listSessions()})
	case opAttach:
		s.attach(st, req)
	case opDelete:
		if err := s.deleteSession(req.Session); err != nil {
			writeMsg(st, errorReply(err))
			return
		}
		writeMsg(st, reply{})
	case opShutdown:
		writeMsg(st, reply{})
		if shutdown != nil {
			shutdown()
		}
	default:
		writeMsg(st, errorReply(providers.Errorf(providers.ErrUnsupported, "unknown op %q", req.Op)))
	}
}

// fitReply cuts a listing's entries until the reply fits maxReply (the
// gateway takes a longer one for a lie), marking it truncated.
func fitReply(rep reply) reply {
	for len(rep.Files) > 0 {
		b, err := json.Marshal(rep)
		if err != nil || len(b) <= maxReply {
			break
		}
		rep.Files, rep.Truncated = rep.Files[:len(rep.Files)*3/4], true
	}
	return rep
}
