package agentwire

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"os"
	"syscall"
)

// On a direct connection over a unix socket, the open op's reply carries
// the opened file itself: SCM_RIGHTS control data on the reply's first
// byte. The gateway then streams through the descriptor without the agent
// copying a byte.

// WriteMsgFile writes v as one message with f's descriptor attached.
func WriteMsgFile(c *net.UnixConn, v any, f *os.File) error {
	buf, err := MarshalMsg(v)
	if err != nil {
		return err
	}
	n, _, err := c.WriteMsgUnix(buf, syscall.UnixRights(int(f.Fd())), nil)
	if err == nil && n < len(buf) {
		_, err = c.Write(buf[n:])
	}
	return err
}

// ReadMsgFile reads one message of at most limit bytes into v and
// returns the descriptors that came with it (the caller closes them, also
// on error). The net package receives with MSG_CMSG_CLOEXEC.
func ReadMsgFile(c *net.UnixConn, v any, limit uint32) ([]*os.File, error) {
	var files []*os.File
	var h [4]byte
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for got := 0; got < len(h); {
		n, oobn, _, _, err := c.ReadMsgUnix(h[got:], oob)
		files = append(files, parseRights(oob[:oobn])...)
		if err != nil {
			return files, err
		}
		if n == 0 {
			if got == 0 {
				return files, io.EOF
			}
			return files, io.ErrUnexpectedEOF
		}
		got += n
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > limit {
		return files, ProtocolErrorf("message length %d over %d", n, limit)
	}
	b, err := ReadPayload(c, nil, int(n))
	if err != nil {
		return files, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return files, ProtocolErrorf("a message that is not JSON of its kind (%v)", err)
	}
	return files, nil
}

// parseRights turns SCM_RIGHTS control data into files.
func parseRights(oob []byte) []*os.File {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "scm-rights"))
		}
	}
	return files
}
