package jail

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/seccomp/load"
)

// initServer is a sandbox's init serving the gateway: package agent's
// server, whose every fork and file lookup runs on init's forker thread.
// Every command is a child of init, so it inherits init's namespaces and
// cgroups.
type initServer struct {
	cfg Config

	// reaper reaps every child of init (commands, and the orphans
	// re-parented to it) and hands a command's status to its waiter.
	reaper *agent.Reaper

	forks chan func() // run on the forker thread
	// forkerTid is the forker thread's id in the sandbox's pid namespace:
	// the gateway moves that thread alone into the sandbox's pids cgroup.
	forkerTid int

	mem memoryCgroup  // the sandbox's memory cgroup, for OOM accounting
	cg  *agent.Cgroup // the sandbox's cgroups, for the agent's metrics
}

// memoryCgroup is a sandbox's cgroup v1 memory controller as init keeps
// it: the files it reads after its root is no longer the host's.
type memoryCgroup struct {
	oomControl *os.File // memory.oom_control; nil without one
	limit      int64    // memory.limit_in_bytes at the start
}

// openMemoryCgroup opens the memory cgroup at dir ("": none).
func openMemoryCgroup(dir string) memoryCgroup {
	var m memoryCgroup
	if dir == "" {
		return m
	}
	m.oomControl, _ = os.Open(dir + "/memory.oom_control")
	if b, err := os.ReadFile(dir + "/memory.limit_in_bytes"); err == nil {
		m.limit, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if m.limit >= 1<<50 { // "unlimited"
			m.limit = 0
		}
	}
	return m
}

// oomKills is the cgroup's count of processes killed for want of memory.
func (m memoryCgroup) oomKills() int64 {
	if m.oomControl == nil {
		return 0
	}
	buf := make([]byte, 512)
	n, _ := m.oomControl.ReadAt(buf, 0)
	return procfs.ParseOOMKills(buf[:n])
}

func newInitServer(cfg Config) *initServer {
	return &initServer{cfg: cfg, forks: make(chan func())}
}

// start starts the reaper and the forker. They live as long as init.
func (a *initServer) start() error {
	a.reaper = agent.NewReaper(false) // init is PID 1: it reaps every orphan anyway
	started := make(chan error, 1)
	go a.forker(started)
	return <-started
}

// onForker runs fn on the forker thread (see forker).
func (a *initServer) onForker(fn func()) {
	done := make(chan struct{})
	a.forks <- func() {
		defer close(done)
		fn()
	}
	<-done
}

// forker performs every fork on one locked OS thread whose capability
// bounding set lacks CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_NET_ADMIN (but
// those the create's cap_add keeps, see droppedCaps) and which runs under
// the seccomp filter of Docker's default profile. The bounding set and the
// filter are per thread and a child inherits its forking thread's, so
// commands can neither mount nor unmount (e.g. to uncover what a mount
// hides), nor ptrace init, nor make namespaces, nor reach the kernel
// interfaces the profile closes. Files are opened on it too, with exactly
// a command's privileges. This works with cgo linked too, where
// AllThreadsSyscall (the whole-process drop) is not supported.
func (a *initServer) forker(started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread is tainted on purpose
	if a.cfg.PidsFD {
		// This thread alone, and so every command, into the sandbox's
		// pids cgroup (see Config.PidsFD); init's other threads stay
		// in the parent (see the gateway's joinPids).
		f := os.NewFile(fdInitPids, "pids-tasks")
		_, err := f.Write([]byte("0"))
		f.Close()
		if err != nil {
			started <- fmt.Errorf("join the pids cgroup: %w", err)
			return
		}
	}
	if a.cfg.Isolation == IsolationNamespaces {
		drop, err := droppedCaps(a.cfg.CapAdd)
		if err != nil {
			started <- err
			return
		}
		for _, c := range drop {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
				started <- fmt.Errorf("drop capability %d: %w", c, err)
				return
			}
		}
		if err := load.Install(a.cfg.Seccomp); err != nil {
			started <- fmt.Errorf("seccomp filter: %w", err)
			return
		}
	}
	a.forkerTid = unix.Gettid()
	started <- nil
	// Go checks once per process, at its first start of a process, that
	// pidfds work: by forking a child. Done now, while the gateway says
	// hello and answers the create, the first command does not pay it.
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		p.Release()
	}
	for fn := range a.forks {
		fn()
	}
}

// serve runs init's agent server until the listener closes. Its commands
// fork on the forker thread and init's reaper reaps them; they start from
// the sandbox's environment in its workdir. Its files are the sandbox's
// (sandboxFiles).
func (a *initServer) serve(l net.Listener) {
	o := agent.Options{
		ForkOn:       a.onForker,
		Env:          agent.SandboxEnv(a.cfg.Env),
		Workdir:      a.cfg.Workdir,
		Files:        sandboxFiles{root: "/"},
		Forker:       a.forkerTid,
		PIDNamespace: a.cfg.Isolation == IsolationNamespaces,
		OOMKills:     a.mem.oomKills,
		MemoryLimit:  a.mem.limit,
		Cgroup:       a.cg,
	}
	if a.cfg.Isolation == IsolationNone {
		o.Root = a.cfg.Dir + "/fs"
		o.Files = sandboxFiles{root: o.Root}
	}
	srv := agent.NewServerWith(a.reaper, o)
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			fmt.Fprintf(os.Stderr, "sandgate init: accept: %v\n", err)
			continue
		}
		go srv.Serve(c, nil)
	}
}

// sandboxFiles is init's agent.Files: every path resolved inside root
// ("/" with namespaces, the sandbox's directory without) as files.go
// describes, errors mapped by FileErr.
type sandboxFiles struct{ root string }

func (f sandboxFiles) in(p string, fn func(root *os.File, rel string) error) error {
	rel, err := RelPath(p)
	if err != nil {
		return err
	}
	root, err := os.OpenFile(f.root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer root.Close()
	return FileErr(fn(root, rel))
}

func (f sandboxFiles) Open(p string, write bool) (file *os.File, err error) {
	err = f.in(p, func(root *os.File, rel string) (err error) {
		if rel == "." {
			return unix.EISDIR
		}
		file, err = openUnder(root, rel, write)
		return err
	})
	return file, err
}

// Spill opens an unlinked file in the sandbox's /tmp (its root when it
// has none), on its disk and counted against its limit, resolved inside
// its root as every path is.
func (f sandboxFiles) Spill() (file *os.File, err error) {
	err = f.in("/", func(root *os.File, _ string) error {
		for _, dir := range []string{"tmp", "."} {
			fd, err := openIn(root, dir, unix.O_TMPFILE|unix.O_RDWR, 0o600)
			if err == nil {
				if err := onKernelFS(fd); err != nil {
					unix.Close(fd)
					return err
				}
				file = os.NewFile(uintptr(fd), "sandbox-spool")
				return nil
			}
		}
		return errors.New("no directory of the sandbox takes an unlinked file")
	})
	return file, err
}

func (f sandboxFiles) Stat(p string) (fi providers.FileInfo, err error) {
	err = f.in(p, func(root *os.File, rel string) (err error) {
		fi, err = statUnder(root, rel)
		return err
	})
	return fi, err
}

func (f sandboxFiles) Dir(p string) (dir *os.File, err error) {
	err = f.in(p, func(root *os.File, rel string) (err error) {
		dir, err = dirUnder(root, rel)
		return err
	})
	if errors.Is(err, unix.ENOTDIR) {
		err = providers.Wrap(providers.ErrInvalid, err, p+" is not a directory")
	}
	return dir, err
}

func (f sandboxFiles) List(p string) (entries []providers.FileInfo, truncated bool, err error) {
	err = f.in(p, func(root *os.File, rel string) (err error) {
		entries, truncated, err = listUnder(root, rel)
		return err
	})
	if errors.Is(err, unix.ENOTDIR) {
		err = providers.Wrap(providers.ErrInvalid, err, p+" is not a directory")
	}
	return entries, truncated, err
}
