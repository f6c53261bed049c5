package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// sockAddr is the agent socket's path, shortened through /proc/self/fd
// when it would not fit a sockaddr_un; the returned file (if any) must stay
// open while the path is used.
func sockAddr(dir string) (string, *os.File, error) {
	return sockAddrOf(dir, socketName)
}

func sockAddrOf(dir, socketName string) (string, *os.File, error) {
	p := dir + "/" + socketName
	if len(p) < 100 {
		return p, nil, nil
	}
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), socketName), d, nil
}

// listenAgent binds the agent's socket in dir and returns it as a file to
// hand to init.
func listenAgent(dir string) (*os.File, error) {
	addr, d, err := sockAddr(dir)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // the socket outlives this listener: init serves it
	f, err := ln.File()
	ln.Close()
	return f, err
}

// listenSessions binds the stream socket of init's terminal session host
// in dir and returns it as a file to hand to init.
func listenSessions(dir string) (*os.File, error) {
	addr, d, err := sockAddrOf(dir, sessionsSocket)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	ln.Close()
	return f, err
}

// dial connects to the sandbox's agent.
func (sb *sandbox) dial(ctx context.Context) (*net.UnixConn, error) {
	addr, d, err := sockAddr(sb.dir)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unixpacket", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// call sends one request and reads its reply.
func (sb *sandbox) call(ctx context.Context, req request) (reply, error) {
	c, err := sb.dial(ctx)
	if err != nil {
		return reply{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := sendMsg(c, req); err != nil {
		return reply{}, err
	}
	var rep reply
	files, err := recvMsg(c, &rep)
	closeFiles(files)
	if err != nil {
		return reply{}, err
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

// forkerTid asks the agent for its forker thread's id (in the sandbox's
// pid namespace).
func (sb *sandbox) forkerTid(ctx context.Context) (int, error) {
	rep, err := sb.call(ctx, request{Op: opPing})
	if err == nil && rep.Pid <= 0 {
		err = errors.New("agent did not name its forker thread")
	}
	return rep.Pid, err
}

// spawn starts argv in the background (the entrypoint), output discarded.
func (sb *sandbox) spawn(ctx context.Context, argv []string) error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	c, err := sb.dial(ctx)
	if err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	req := request{Op: opExec, Argv: argv, Env: envList(sb.st.Env, nil), Dir: sb.hostPath(sb.st.Workdir), Preserve: true}
	if err := sendMsg(c, req, null, null, null); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	var rep reply
	files, err := recvMsg(c, &rep)
	closeFiles(files)
	if err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	if rep.Error != "" {
		return providers.Errorf(providers.ErrInvalid, "entrypoint: %s", sb.clientMsg(rep.Error))
	}
	return nil
}

// hostPath is where a sandbox path is for the agent: itself with
// namespaces, under <dir>/fs without.
func (sb *sandbox) hostPath(p string) string {
	if sb.st.Isolation == IsolationNone {
		return sb.dir + "/fs" + p
	}
	return p
}

// clientMsg removes the host part of paths from an agent's message.
func (sb *sandbox) clientMsg(msg string) string {
	if sb.st.Isolation == IsolationNone {
		msg = strings.ReplaceAll(msg, sb.dir+"/fs", "")
	}
	return msg
}

// envList merges base and extra (extra wins) into a sorted KEY=VALUE list.
func envList(base, extra map[string]string) []string {
	m := make(map[string]string, len(base)+len(extra))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}
