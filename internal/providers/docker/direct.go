package docker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// The direct path. Where it can, the gateway connects to a sandbox's
// agent daemon itself, on the daemon's own unix socket (agentSocket, on
// the container's /dev), instead of through an exec of the agent's
// bridge: the bytes then skip dockerd, containerd-shim and the bridge,
// and terminal attachments and files get connections of their own
// (agentclient.WithDirect). The socket is reached through the container's
// root as the kernel shows it to the daemon's host, /proc/<init pid>/root,
// so nothing is made on the host for it and nothing a sandbox writes ever
// lands there.
//
// Nothing the sandbox can plant is followed. The container's init is
// found by the daemon's pid and checked to be the container's (its
// cgroup names the container id; a pidfd taken before the root is opened
// must still be alive after, so the pid was not reused meanwhile). The
// socket is opened with openat2(O_PATH) beneath that root with no
// symlinks, magic links included, at all; the descriptor must be a
// socket (a FIFO, regular file, directory or device is refused without
// being opened); the connect goes through /proc/self/fd/N, so it reaches
// that very inode, and is non-blocking (a full backlog fails at once).
// The listener's credentials (SO_PEERCRED) must name a process in the
// container's pid namespace. Its bytes are the agent protocol, untrusted
// as on the exec path (a sandbox's root can replace its agent either
// way).
//
// Anything that fails (a daemon that is not on a unix socket or not on
// this host's pid namespace, a gateway without the rights to the
// container's /proc, the socket replaced, a peer outside the sandbox)
// falls back to the exec path, the same for that connection's life; the
// next connection (a gateway restart, a broken one) tries direct again.
// Extra["agent_transport"] says which the create got.

// agentSocket is agent.SocketPath: where the agent daemon listens inside
// the container (TestAgentSocketPath keeps them equal).
const agentSocket = "/dev/.sandgate-agent.sock"

// Transports, as Extra["agent_transport"] names them.
const (
	TransportDirect = "direct"
	TransportExec   = "exec"
)

// direct holds the provider's direct-path state.
type direct struct {
	off  string // why the direct path is never tried ("" = it is)
	proc string // the proc filesystem; "/proc" but in tests
	sock string // the agent's socket beneath the container's root; agentSocket but in tests

	mu        sync.Mutex
	targets   map[string]target // by sandbox id
	transport map[string]string // by sandbox id: how its current connection goes
}

// target is a running sandbox's init as the direct path found it.
type target struct {
	pid int
	ns  nsID // its pid namespace
}

type nsID struct{ dev, ino uint64 }

// errNotDirect marks an error of the direct path; the exec path is used.
var errNotDirect = errors.New("no direct path")

// dialDirect connects to sandbox id's agent socket directly (see the top
// of this file), within ctx. Every error is errNotDirect, with why.
func (d *Docker) dialDirect(ctx context.Context, id string) (*net.UnixConn, error) {
	if d.direct.off != "" {
		return nil, fmt.Errorf("%w: %s", errNotDirect, d.direct.off)
	}
	t, ok := d.cachedTarget(id)
	if !ok {
		var err error
		if t, err = d.findTarget(ctx, id); err != nil {
			return nil, err
		}
	}
	conn, err := d.direct.connect(ctx, t)
	if err != nil && ok {
		// The container may have stopped, or restarted: its init is
		// another process.
		d.forgetTarget(id)
		if t, err = d.findTarget(ctx, id); err != nil {
			return nil, err
		}
		conn, err = d.direct.connect(ctx, t)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNotDirect, err)
	}
	d.direct.mu.Lock()
	d.direct.targets[id] = t
	d.direct.mu.Unlock()
	return conn, nil
}

func (d *Docker) cachedTarget(id string) (target, bool) {
	d.direct.mu.Lock()
	defer d.direct.mu.Unlock()
	t, ok := d.direct.targets[id]
	return t, ok
}

func (d *Docker) forgetTarget(id string) {
	d.direct.mu.Lock()
	defer d.direct.mu.Unlock()
	delete(d.direct.targets, id)
}

// findTarget asks the daemon for sandbox id's init and checks that this
// host's /proc shows that very process: its cgroup names the container.
// A sandbox that is not there or not running is its error kind
// (ErrNotFound, ErrConflict; ErrUnavailable when the daemon does not
// answer); anything else is errNotDirect.
func (d *Docker) findTarget(ctx context.Context, id string) (target, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return target{}, d.kind(err, "sandbox %s", id)
	}
	if info.Config == nil || info.Config.Labels[LabelSandbox] != id || info.Config.Labels[LabelInstance] != d.instance {
		return target{}, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	if info.State == nil || !info.State.Running || info.State.Paused || info.State.Pid <= 0 {
		st, _ := stateOf(info.State)
		return target{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, st)
	}
	pid := info.State.Pid
	var t target
	err = d.direct.pinned(pid, func() error {
		cg, err := os.ReadFile(fmt.Sprintf("%s/%d/cgroup", d.direct.proc, pid))
		if err != nil {
			return err
		}
		if len(info.ID) < 64 || !bytes.Contains(cg, []byte(info.ID)) {
			return fmt.Errorf("pid %d is not in the container's cgroup (another pid namespace?)", pid)
		}
		t.ns, err = d.direct.pidNS(pid)
		return err
	})
	if err != nil {
		return target{}, fmt.Errorf("%w: %v", errNotDirect, err)
	}
	t.pid = pid
	return t, nil
}

// pinned runs fn, which reads /proc/<pid>, and fails unless pid named the
// same live process from before fn to after it.
func (x *direct) pinned(pid int, fn func() error) error {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	if err := fn(); err != nil {
		return err
	}
	if err := unix.PidfdSendSignal(pidfd, 0, nil, 0); err != nil {
		return fmt.Errorf("pid %d: %w", pid, err)
	}
	return nil
}

// pidNS identifies pid's pid namespace.
func (x *direct) pidNS(pid int) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("%s/%d/ns/pid", x.proc, pid), &st); err != nil {
		return nsID{}, err
	}
	return nsID{uint64(st.Dev), st.Ino}, nil
}

// connect opens t's agent socket and checks its listener.
func (x *direct) connect(ctx context.Context, t target) (*net.UnixConn, error) {
	var sock int = -1
	err := x.pinned(t.pid, func() error {
		ns, err := x.pidNS(t.pid)
		if err != nil {
			return err
		}
		if ns != t.ns {
			return fmt.Errorf("pid %d is in another pid namespace", t.pid)
		}
		root, err := unix.Open(fmt.Sprintf("%s/%d/root", x.proc, t.pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(root)
		sock, err = openSocket(root, x.sock)
		return err
	})
	if err != nil {
		if sock >= 0 {
			unix.Close(sock)
		}
		return nil, err
	}
	defer unix.Close(sock)
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(sock))
	if err != nil {
		return nil, err
	}
	uc := c.(*net.UnixConn)
	if err := x.checkPeer(uc, t); err != nil {
		uc.Close()
		return nil, err
	}
	return uc, nil
}

// openSocket opens rel beneath the directory root as an O_PATH
// descriptor without following any link, and returns it only if it is a
// socket.
func openSocket(root int, rel string) (int, error) {
	fd, err := unix.Openat2(root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a socket (mode %#o)", rel, st.Mode&unix.S_IFMT)
	}
	return fd, nil
}

// checkPeer checks that c's listener is a process of t's pid namespace.
func (x *direct) checkPeer(c *net.UnixConn, t target) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if cred.Pid <= 0 {
		return errors.New("the listener is in no pid namespace this gateway sees")
	}
	ns, err := x.pidNS(int(cred.Pid))
	if err != nil {
		return fmt.Errorf("the listener, pid %d: %w", cred.Pid, err)
	}
	if ns != t.ns {
		return fmt.Errorf("the listener, pid %d, is not in the sandbox's pid namespace", cred.Pid)
	}
	return nil
}

// setTransport records how sandbox id's current connection goes.
func (d *Docker) setTransport(id, how string) {
	d.direct.mu.Lock()
	defer d.direct.mu.Unlock()
	d.direct.transport[id] = how
}

// Transport is how sandbox id's agent connection goes (TransportDirect,
// TransportExec), or "" before its first connection.
func (d *Docker) Transport(id string) string {
	d.direct.mu.Lock()
	defer d.direct.mu.Unlock()
	return d.direct.transport[id]
}

// dropDirect forgets sandbox id (it is being deleted).
func (d *Docker) dropDirect(id string) {
	d.direct.mu.Lock()
	defer d.direct.mu.Unlock()
	delete(d.direct.targets, id)
	delete(d.direct.transport, id)
}

// directOff is why the direct path is never tried with the daemon at
// host and the given transport option, or "".
func directOff(host, transport string) string {
	switch {
	case transport == TransportExec:
		return "Options.AgentTransport is exec"
	case !strings.HasPrefix(host, "unix://"):
		return "the daemon is not on a unix socket"
	}
	return ""
}

// checkTransport validates Options.AgentTransport.
func checkTransport(s string) error {
	switch s {
	case "", "auto", TransportExec:
		return nil
	}
	return providers.Errorf(providers.ErrInvalid, "docker: agent transport %q is not auto or exec", s)
}
