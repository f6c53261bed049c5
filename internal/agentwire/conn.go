package agentwire

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// frameConn joins each yamux data frame's header and body into one
// write. yamux's send loop writes a frame's 12-byte header and its body
// with two calls; on a socket that is two syscalls and, through a Docker
// exec attach, two trips through the daemon. frameConn holds a data
// header (type 0, non-zero length) back and writes it with the body that
// follows; every other write passes straight through. Only yamux's send
// loop writes to it.
type FrameConn struct {
	io.ReadWriteCloser
	mu  sync.Mutex
	hdr []byte // a held data header; nil when none
}

const muxHeader = 12

func (c *FrameConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hdr != nil {
		hdr := c.hdr
		c.hdr = nil
		var err error
		if nc, ok := c.ReadWriteCloser.(net.Conn); ok {
			bufs := net.Buffers{hdr, p}
			_, err = bufs.WriteTo(nc)
		} else {
			_, err = c.ReadWriteCloser.Write(append(hdr, p...))
		}
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
	if len(p) == muxHeader && p[1] == 0 && binary.BigEndian.Uint32(p[8:]) > 0 {
		c.hdr = append(make([]byte, 0, muxHeader), p...)
		return len(p), nil
	}
	return c.ReadWriteCloser.Write(p)
}

// muxConfig is the yamux configuration both ends use.
func MuxConfig() *yamux.Config {
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
