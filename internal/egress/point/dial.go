package point

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// spareSockets is how many unconnected sockets the egress namespace's
// socket maker keeps ready; it is woken to refill when half are taken.
const spareSockets = 32

// socketMaker makes TCP sockets in the egress namespace ahead of need, on
// one OS thread that stays in that namespace, so that a proxied connection
// takes a socket off a channel instead of switching a thread's namespace
// twice (and handing its dial between threads) on the connection's path.
// The maker is woken once per spareSockets/2 sockets taken, not per
// socket: a locked goroutine's wake-up hands its P to its thread, which a
// loaded machine may not run at once. A socket's namespace is fixed when
// it is made; it is connected, and used, from any thread.
type socketMaker struct {
	socks chan madeSocket // only the maker sends
	need  chan struct{}   // cap 1: wake the maker to refill
	stop  chan struct{}
	done  chan struct{}
}

type madeSocket struct {
	fd  int
	err error
}

func startSocketMaker(ns netns.NsHandle) *socketMaker {
	sm := &socketMaker{
		socks: make(chan madeSocket, spareSockets), need: make(chan struct{}, 1),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go sm.run(ns)
	return sm
}

func (sm *socketMaker) run(ns netns.NsHandle) {
	defer close(sm.done)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err == nil {
		defer orig.Close()
		err = netns.Set(ns)
	}
	for {
		// Only the maker sends, so a channel below capacity takes a
		// send without blocking.
		for len(sm.socks) < cap(sm.socks) {
			s := madeSocket{fd: -1, err: err}
			if err == nil {
				s.fd, s.err = newTCPSocket()
			}
			sm.socks <- s
		}
		select {
		case <-sm.need:
		case <-sm.stop:
			// A thread whose namespace is unknown (err) dies with this
			// goroutine: it is never unlocked.
			if err == nil && netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
	}
}

// get takes a socket made in the egress namespace (or the error the maker
// got making it).
func (sm *socketMaker) get(ctx context.Context) (int, error) {
	if len(sm.socks) <= cap(sm.socks)/2 {
		select {
		case sm.need <- struct{}{}:
		default:
		}
	}
	select {
	case s := <-sm.socks:
		return s.fd, s.err
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

// close stops the maker and closes the sockets it had ready.
func (sm *socketMaker) close() {
	close(sm.stop)
	<-sm.done
	for {
		select {
		case s := <-sm.socks:
			if s.err == nil {
				unix.Close(s.fd)
			}
		default:
			return
		}
	}
}

// newTCPSocket makes a non-blocking IPv4 TCP socket in the calling
// thread's network namespace.
func newTCPSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return -1, os.NewSyscallError("socket", err)
	}
	return fd, nil
}

// connecting is a connection to an admitted destination whose handshake
// was started (startConnect) and is not yet waited for: the proxy starts
// it before it reads the client's first bytes, so the two overlap.
type connecting struct {
	f *os.File // the socket, in the poller
}

// startConnect starts connecting fd (which it owns from then on) to dst.
func startConnect(fd int, dst netip.AddrPort) (*connecting, error) {
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	switch err := unix.Connect(fd, sa); err {
	case nil, unix.EINPROGRESS, unix.EINTR:
		// EINTR: the connect goes on asynchronously, as EINPROGRESS.
	default:
		unix.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	// A non-blocking descriptor: the os package puts it in the poller.
	return &connecting{f: os.NewFile(uintptr(fd), "egress "+dst.String())}, nil
}

// finish waits for the handshake (until ctx ends) and returns the
// connection as a *net.TCPConn, which splices.
func (c *connecting) finish(ctx context.Context) (net.Conn, error) {
	defer c.f.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.f.SetWriteDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rc, err := c.f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cerr error
	err = rc.Write(func(fd uintptr) bool {
		// Done when the socket has an error or a peer; otherwise wait for
		// it to become writable and look again.
		if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR); err != nil || v != 0 {
			cerr = err
			if err == nil {
				cerr = unix.Errno(v)
			}
			cerr = os.NewSyscallError("connect", cerr)
			return true
		}
		_, err := unix.Getpeername(int(fd))
		if errors.Is(err, unix.ENOTCONN) {
			return false
		}
		cerr = err
		return true
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if cerr != nil {
		return nil, cerr
	}
	// FileConn dups the socket; the deferred Close drops the original.
	_ = c.f.SetWriteDeadline(time.Time{})
	return net.FileConn(c.f)
}
