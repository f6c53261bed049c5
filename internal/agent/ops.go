package agent

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// The file ops go through Options.Files when it is set, on the fork
// thread; else the agent resolves paths itself.

func (s *Server) openRead(p string) (*os.File, int64, error) {
	if s.opts.Files == nil {
		return openRead(p)
	}
	f, err := s.openFile(p, false)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

func (s *Server) writeTo(p string, r io.Reader) (int64, error) {
	if s.opts.Files == nil {
		return writeTo(p, r)
	}
	f, err := s.openFile(p, true)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// openFile opens the regular file at p, for reading or (created with its
// parents, truncated) for writing: through Options.Files when set, else
// here.
func (s *Server) openFile(p string, write bool) (f *os.File, err error) {
	switch {
	case s.opts.Files != nil:
		s.opts.ForkOn(func() { f, err = s.opts.Files.Open(p, write) })
	case write:
		f, err = openWrite(p)
	default:
		f, _, err = openRead(p)
	}
	return f, err
}

func (s *Server) stat(p string) (fi providers.FileInfo, err error) {
	if s.opts.Files == nil {
		return statPath(p)
	}
	s.opts.ForkOn(func() { fi, err = s.opts.Files.Stat(p) })
	return fi, err
}

func (s *Server) list(p string) (entries []providers.FileInfo, truncated bool, err error) {
	if s.opts.Files == nil {
		return listPath(p)
	}
	s.opts.ForkOn(func() { entries, truncated, err = s.opts.Files.List(p) })
	return entries, truncated, err
}

// open serves the open op: the file itself goes back with the reply,
// which only a direct connection on a unix socket can carry.
func (s *Server) open(st io.Writer, uc *net.UnixConn, req agentwire.Request) {
	if uc == nil {
		agentwire.WriteMsg(st, agentwire.ErrorReply(providers.Errorf(providers.ErrUnsupported, "open passes a descriptor: a direct connection on a unix socket only")))
		return
	}
	f, err := s.openFile(req.Path, req.Write)
	if err != nil {
		agentwire.WriteMsg(st, agentwire.ErrorReply(err))
		return
	}
	defer f.Close()
	agentwire.WriteMsgFile(uc, agentwire.Reply{}, f)
}

// spawnArgv starts req.Argv in its own session with its output
// discarded, and leaves it running: the reaper collects its status.
func (s *Server) spawnArgv(req agentwire.ExecRequest) error {
	cmd, err := s.command(req.Argv, req.User, req.Cwd, req.Env)
	if err != nil {
		return err
	}
	cmd.SysProcAttr.Setsid = true
	waited, err := s.spawn(cmd, cmd.Start, false)
	if err != nil {
		return providers.Errorf(providers.ErrInvalid, "start %s: %v", req.Argv[0], unwrapExec(err))
	}
	go func() {
		<-waited
		cmd.Process.Release()
	}()
	return nil
}

// unwrapExec is the system's reason inside an os/exec start error.
func unwrapExec(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// signalAll sends sig to every process of the sandbox but the agent:
// kill(-1) from its PID 1.
func (s *Server) signalAll(sig int) error {
	if !s.opts.PIDNamespace {
		return providers.Errorf(providers.ErrUnsupported, "signal_all needs the agent to be its sandbox's PID 1")
	}
	if sig <= 0 || sig >= 65 {
		return providers.Errorf(providers.ErrInvalid, "unknown signal %d", sig)
	}
	if err := syscall.Kill(-1, syscall.Signal(sig)); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
