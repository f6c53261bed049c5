package testkit

import (
	"io"
	"net"
	"testing"
)

// ServePipe runs serve on one end (a) of a net.Pipe, on a goroutine of its
// own, and returns both ends; served is closed when serve returns, which
// it must once a or b is closed. The caller closes the ends and waits on
// served.
func ServePipe(serve func(a net.Conn)) (a, b net.Conn, served <-chan struct{}) {
	a, b = net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(a)
	}()
	return a, b, done
}

// DialPipe serves serve on one end of a net.Pipe (ServePipe) and returns
// dial's client of the other end, failing t if dial fails. When t ends,
// the client and the server's end are closed and serve is waited for;
// clean-ups registered before DialPipe (say, closing the server) run
// after that.
func DialPipe[C io.Closer](t testing.TB, serve func(a net.Conn), dial func(b net.Conn) (C, error)) C {
	t.Helper()
	a, b, served := ServePipe(serve)
	c, err := dial(b)
	if err != nil {
		a.Close()
		b.Close()
		<-served
		t.Fatalf("dial over the pipe: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		a.Close()
		<-served
	})
	return c
}
