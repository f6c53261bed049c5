package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// The agent protocol. The gateway and a sandbox's init talk over a
// SOCK_SEQPACKET unix socket, one connection per operation. Every message is
// JSON, split into chunks of at most chunkSize bytes; the first byte of each
// chunk says whether more follow. File descriptors travel with SCM_RIGHTS on
// the first chunk only.
//
// exec:   gateway → {op:exec} + [stdin, stdout, stderr]
//                   or {op:exec, tty} (no descriptors: the agent opens a PTY inside)
//         agent   → {pid} + [pidfd] (+ [pty master] with tty)   or {error, kind}
//         gateway → {op:kill}          (optional, any number of times)
//         agent   → {exited, code}     then closes
//         gateway → {op:signal, signal, foreground} (optional: a signal delivered inside)
// open:   gateway → {op:open, path, write}
//         agent   → {} + [the opened file]   or {error, kind, errno}
// stat, list: gateway → {op:stat|list, path}
//         agent   → {entries, truncated}     or {error, kind, errno}
// ping, signal, killall: one request, one reply.

const (
	opExec    = "exec"
	opKill    = "kill"    // on an exec connection: kill the command's group, session and descendants
	opPing    = "ping"    // readiness and liveness
	opSignal  = "signal"  // kill(-1, Signal) inside the sandbox: the pause fallback
	opKillAll = "killall" // SIGKILL every descendant of init (isolation none has no pid namespace to do it)
	opOpen    = "open"    // open a regular file inside the sandbox, as sandbox root, and send it back
	opStat    = "stat"    // describe a file inside the sandbox, as sandbox root
	opList    = "list"    // list a directory inside the sandbox, as sandbox root
)

const (
	chunkSize  = 32 << 10
	maxMessage = 8 << 20 // execve caps argv+env at a few MiB; anything bigger is a bug
	chunkMore  = 'M'
	chunkEnd   = 'E'
)

// request is what the gateway sends.
type request struct {
	Op string `json:"op"`

	// exec
	Command  string   `json:"command,omitempty"` // run by bash -c or sh -c
	Argv     []string `json:"argv,omitempty"`    // run as is (entrypoint); used when Command is ""
	Env      []string `json:"env,omitempty"`     // KEY=VALUE; defaults (PATH, HOME, USER) fill what is missing
	Dir      string   `json:"dir,omitempty"`
	User     string   `json:"user,omitempty"`
	Preserve bool     `json:"preserve,omitempty"`
	// Shell runs the interactive login shell (bash, else sh) when Command
	// and Argv are empty: a terminal session.
	Shell bool `json:"shell,omitempty"`
	// TTY has the agent open a PTY inside the sandbox (Rows x Cols), make
	// its slave the command's stdio and controlling terminal, and send its
	// master back with the pidfd.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`

	// signal (also on an exec connection: to the command's group, or with
	// Foreground to its terminal's foreground group)
	Signal     int  `json:"signal,omitempty"`
	Foreground bool `json:"foreground,omitempty"`

	// open, stat, list
	Path  string `json:"path,omitempty"`  // absolute, inside the sandbox
	Write bool   `json:"write,omitempty"` // open: create (with parents) and truncate, else read
}

// Error kinds the agent reports, so the gateway can map them.
const (
	kindInvalid = "invalid"
	kindRuntime = "runtime"
)

// reply is what the agent sends.
type reply struct {
	Pid    int    `json:"pid,omitempty"` // exec: the command's; ping: the forker thread's id
	Error  string `json:"error,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Exited bool   `json:"exited,omitempty"`
	Code   int    `json:"code,omitempty"`
	Errno  int    `json:"errno,omitempty"` // open, stat, list: the system error, for the gateway to classify

	// stat (one entry) and list
	Entries   []providers.FileInfo `json:"entries,omitempty"`
	Truncated bool                 `json:"truncated,omitempty"`

	// exec's exit: what the command used, measured in the sandbox
	Ran    time.Duration `json:"ran,omitempty"`     // from its start to its exit
	CPU    time.Duration `json:"cpu,omitempty"`     // user + system, with the children it waited for
	MaxRSS int64         `json:"max_rss,omitempty"` // bytes, its or its largest waited-for child's
}

// sendMsg writes v as one message, with files attached to its first chunk.
func sendMsg(c *net.UnixConn, v any, files ...*os.File) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxMessage {
		return fmt.Errorf("message of %d bytes exceeds %d", len(b), maxMessage)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = syscall.UnixRights(fds...)
	}
	chunk := make([]byte, 0, chunkSize+1)
	for first := true; first || len(b) > 0; first = false {
		n := min(len(b), chunkSize)
		tag := byte(chunkEnd)
		if n < len(b) {
			tag = chunkMore
		}
		chunk = append(append(chunk[:0], tag), b[:n]...)
		b = b[n:]
		if _, _, err := c.WriteMsgUnix(chunk, oob, nil); err != nil {
			return err
		}
		oob = nil
	}
	return nil
}

// errEmpty is a zero-length read: the peer closed the connection.
var errEmpty = errors.New("connection closed by peer")

// recvMsg reads one message into v and returns the files that came with it.
// The caller owns (and closes) the files, also when err is not nil.
func recvMsg(c *net.UnixConn, v any) ([]*os.File, error) {
	buf := make([]byte, chunkSize+1)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	var (
		msg   []byte
		files []*os.File
	)
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if oobn > 0 {
			files = append(files, parseRights(oob[:oobn])...)
		}
		if err != nil {
			return files, err
		}
		if n == 0 {
			return files, errEmpty
		}
		msg = append(msg, buf[1:n]...)
		if len(msg) > maxMessage {
			return files, fmt.Errorf("message exceeds %d bytes", maxMessage)
		}
		if buf[0] == chunkEnd {
			break
		}
	}
	return files, json.Unmarshal(msg, v)
}

// parseRights turns SCM_RIGHTS control data into files. The net package
// receives with MSG_CMSG_CLOEXEC, so the descriptors are already close-on-exec.
func parseRights(oob []byte) []*os.File {
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

func closeFiles(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}
