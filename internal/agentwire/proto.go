// Package agentwire is the protocol between sandgate's in-sandbox agent
// (package agent) and the gateway's client of it (package agentclient):
// the messages, frames, limits, error kinds and multiplexer settings both
// sides share.
//
// The protocol is yamux over whatever byte stream the backend offers (a
// Docker exec attach, a unix socket): one stream per request. A stream
// starts with a message (a 4-byte big-endian length and a JSON object)
// naming the op; what follows is op-specific: messages, frames (a type
// byte, a 4-byte length, the payload) or raw bytes. The first stream of a
// connection is the hello, which carries the protocol version; an agent
// speaking another version is refused with an error naming both. A
// connection that starts with DirectMagic instead carries one call, no
// multiplexing.
package agentwire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// Version is the protocol this build speaks. It is a variable only so a
// test can build an agent that speaks another (-ldflags -X).
var Version = "2"

// directMagic starts a direct connection: one call on the connection
// itself instead of a yamux stream (a yamux connection starts with its
// version byte, 0).
const DirectMagic = "SGD1"

// The ops.
const (
	OpHello    = "hello"
	OpExec     = "exec"
	OpRead     = "read"
	OpWrite    = "write"
	OpStat     = "stat"
	OpReadDir  = "readdir"
	OpStart    = "session.start"
	OpList     = "session.list"
	OpAttach   = "session.attach"
	OpDelete   = "session.delete"
	OpShutdown = "shutdown" // tests: the agent exits
	OpMetrics  = "metrics"  // → Metrics: the sandbox's resource use (see providers.Metrics)

	// Durable commands (see CommandInfo): started, then watched, waited
	// for and read by offset from any connection, until forgotten.
	OpCmdStart  = "command.start"  // Exec (with ID) → Command
	OpCmdList   = "command.list"   // → Commands
	OpCmdGet    = "command.get"    // ID → Command
	OpCmdWait   = "command.wait"   // ID, TimeoutMS → Command, once it finished or TimeoutMS passed
	OpCmdRead   = "command.read"   // ID, Since, SinceErr, Follow → Command, then output frames (see OpCmdRead's doc in the agent)
	OpCmdSignal = "command.signal" // ID, Signal: to the command's process group
	OpCmdDelete = "command.delete" // ID: kill its tree, then forget it

	// A local sandbox's init (package providers/local) serves these too.
	OpOpen      = "open"       // open a file and pass its descriptor (a unix socket's direct connection only)
	OpSpawn     = "spawn"      // start Exec.Argv in the background, output discarded (the entrypoint)
	OpSignalAll = "signal_all" // kill(-1, Signal): every process of the sandbox but the agent (its PID 1)
	OpKillAll   = "kill_all"   // SIGKILL every descendant of the agent
)

// request is the first message of every stream.
type Request struct {
	Op      string          `json:"op"`
	Version string          `json:"version,omitempty"` // hello
	Exec    *ExecRequest    `json:"exec,omitempty"`
	Path    string          `json:"path,omitempty"`    // read, write, stat, readdir, open
	Write   bool            `json:"write,omitempty"`   // open: create (with parents) and truncate, else read
	Signal  int             `json:"signal,omitempty"`  // signal_all
	Session string          `json:"session,omitempty"` // attach, delete
	Since   int64           `json:"since,omitempty"`   // attach
	TTY     *bool           `json:"tty,omitempty"`     // attach: the mode of a deferred session's start
	Start   *StartRequest   `json:"start,omitempty"`
	Extra   json.RawMessage `json:"extra,omitempty"`
	// ID names a durable command (command.*).
	ID string `json:"id,omitempty"`
	// SinceErr is command.read's stderr offset (Since is stdout's).
	SinceErr int64 `json:"since_err,omitempty"`
	// Follow (command.read) keeps the stream open: output frames as the
	// command writes them, then an exit frame (the final CommandInfo).
	Follow bool `json:"follow,omitempty"`
	// TimeoutMS bounds command.wait.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// MaxReplay (attach) bounds the replay to the last MaxReplay bytes
	// from Since: the gateway takes a longer one for a lie.
	MaxReplay int64 `json:"max_replay,omitempty"`
	// Watch is what OpWatch watches.
	Watch *WatchRequest `json:"watch,omitempty"`
}

// reply is the agent's first message on a stream; Error set means the op
// failed and nothing follows.
type Reply struct {
	Error   string `json:"error,omitempty"`
	Kind    string `json:"kind,omitempty"` // the providers error kind of Error
	Version string `json:"version,omitempty"`
	Agent   string `json:"agent,omitempty"` // hello: the agent's build
	// Forker (hello) is the id of the thread every command forks on, in
	// the sandbox's pid namespace, when the agent has one (a local
	// sandbox's init): the gateway moves that thread alone into the
	// sandbox's pids cgroup.
	Forker   int           `json:"forker,omitempty"`
	Size     int64         `json:"size,omitempty"` // read: the file's size; write: bytes written
	Session  *SessionInfo  `json:"session,omitempty"`
	Sessions []SessionInfo `json:"sessions,omitempty"`
	Replay   int64         `json:"replay,omitempty"` // attach: the offset of the first replayed byte

	File      *providers.FileInfo  `json:"file,omitempty"`  // stat
	Files     []providers.FileInfo `json:"files,omitempty"` // readdir, sorted by name
	Truncated bool                 `json:"truncated,omitempty"`

	Command  *CommandInfo  `json:"command,omitempty"`  // command.*, and exec: the command it started
	Commands []CommandInfo `json:"commands,omitempty"` // command.list, oldest first

	Watcher  string              `json:"watcher,omitempty"`   // fs.watcher.create: its id
	Events   []WatchEvent        `json:"events,omitempty"`    // fs.watcher.events, oldest first
	WatchEnd *WatchEnd           `json:"watch_end,omitempty"` // fs.watcher.events: it ended (the watcher is gone)
	Metrics  []providers.Metrics `json:"metrics,omitempty"`   // metrics: oldest first, at most providers.MaxMetrics
}

// execRequest is providers.ExecRequest on the wire.
type ExecRequest struct {
	Command string   `json:"command"`
	Argv    []string `json:"argv,omitempty"` // spawn: run as is, found in the PATH

	Cwd                string            `json:"cwd,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	TimeoutMS          int64             `json:"timeout_ms"`
	User               string            `json:"user,omitempty"`
	Stdin              []byte            `json:"stdin,omitempty"`
	HasStdin           bool              `json:"has_stdin,omitempty"`
	PreserveBackground bool              `json:"preserve_background,omitempty"`
	MaxOutput          int               `json:"max_output"`

	// ID makes the command durable (exec, command.start): the agent
	// holds it, its output (up to MaxOutput per stream, spilled to the
	// sandbox's disk) and its result under this id, chosen by the
	// gateway, until RetainMS after it ends or it is deleted. An exec
	// stream that closes early then leaves it running, unless
	// KillOnDisconnect.
	ID               string `json:"id,omitempty"`
	RetainMS         int64  `json:"retain_ms,omitempty"`
	KillOnDisconnect bool   `json:"kill_on_disconnect,omitempty"`
}

// CommandInfo describes a durable command the agent holds.
type CommandInfo struct {
	ID         string     `json:"id"`
	Command    string     `json:"command"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code,omitempty"` // set once it ended; 125 when it timed out
	TimedOut   bool       `json:"timed_out,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	DurationUS int64      `json:"duration_us"`
	CPUTimeUS  int64      `json:"cpu_time_us"`
	PeakRSS    int64      `json:"peak_rss"` // bytes
	OOMKilled  bool       `json:"oom_killed,omitempty"`
	StdoutSize int64      `json:"stdout_size"` // bytes kept: the end offset of stdout
	StderrSize int64      `json:"stderr_size"`
	Truncated  bool       `json:"truncated,omitempty"` // a stream reached MaxOutput; the rest was discarded
	MaxOutput  int64      `json:"max_output"`
}

// execResult ends an exec stream (frameResult).
type ExecResult struct {
	ExitCode   int    `json:"exit_code"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	DurationUS int64  `json:"duration_us"`
	CPUTimeUS  int64  `json:"cpu_time_us"`
	PeakRSS    int64  `json:"peak_rss"` // bytes
	OOMKilled  bool   `json:"oom_killed,omitempty"`
	Error      string `json:"error,omitempty"`
	Kind       string `json:"kind,omitempty"`
}

// startRequest starts a terminal session.
type StartRequest struct {
	ID        string                `json:"id"` // chosen by the gateway
	Spec      providers.ProcessSpec `json:"spec"`
	Deferred  bool                  `json:"deferred,omitempty"` // start at the first attach, in its mode
	RingBytes int                   `json:"ring_bytes,omitempty"`
}

// SessionInfo describes a terminal session the agent holds.
type SessionInfo struct {
	ID           string    `json:"id"`
	TTY          bool      `json:"tty"`
	Started      bool      `json:"started"` // false: deferred until the first attach
	Running      bool      `json:"running"`
	ExitCode     *int      `json:"exit_code,omitempty"`
	Lost         bool      `json:"lost,omitempty"` // ended without an exit status
	OutputOffset int64     `json:"output_offset"`
	CreatedAt    time.Time `json:"created_at"`
}

// Frame types. Agent to gateway: output, stderr, the exec result, a
// session's exit. Gateway to agent (on an attach): stdin, stdin EOF,
// resize, signal.
const (
	FrameStdout byte = 'o'
	FrameStderr byte = 'e'
	FrameResult byte = 'r'
	FrameExit   byte = 'x'
	FrameReplay byte = 'R'
	FrameSlow   byte = 'S' // the subscriber fell a whole ring behind: output was lost to it
	FrameStdin  byte = 'i'
	FrameEOF    byte = 'E'
	FrameResize byte = 'z'
	FrameSignal byte = 's'
)

// maxRequest bounds a request (stdin of an exec rides in one); maxReply
// bounds a reply, which the gateway reads from code it does not trust.
const (
	MaxRequest = 64 << 20
	MaxReply   = 1 << 20
)

// maxFrame bounds a frame's payload.
const MaxFrame = 1 << 20

func WriteMsg(w io.Writer, v any) error {
	b, err := MarshalMsg(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// MarshalMsg is v as a message: its length and its JSON.
func MarshalMsg(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	return append(buf, b...), nil
}

// ProtocolError is a message or frame that breaks the protocol: a length
// over its bound or a payload that does not decode. The gateway treats
// one from an agent as a lie (Client.Violation).
type ProtocolError struct{ What string }

func (e *ProtocolError) Error() string { return "agent protocol violation: " + e.What }

func ProtocolErrorf(format string, args ...any) error {
	return &ProtocolError{What: fmt.Sprintf(format, args...)}
}

// readMsg reads one message of at most limit bytes into v. An announced
// length over limit, or a body that is not v's JSON, is a *ProtocolError.
func ReadMsg(r io.Reader, v any, limit uint32) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > limit {
		return ProtocolErrorf("message length %d over %d", n, limit)
	}
	b, err := ReadPayload(r, nil, int(n))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return ProtocolErrorf("a message that is not JSON of its kind (%v)", err)
	}
	return nil
}

// readPayload reads an n-byte payload into buf, growing it as the bytes
// arrive rather than to n at once: a peer that announces n but sends
// less costs only what it sent.
func ReadPayload(r io.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) >= n {
		buf = buf[:n]
		_, err := io.ReadFull(r, buf)
		return buf, err
	}
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(max(2*cap(buf), payloadStep), n))
			copy(nb, buf)
			buf = nb
		}
		k, err := io.ReadFull(r, buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// payloadStep is readPayload's first allocation for a payload larger than
// the buffer it was given.
const payloadStep = 64 << 10

func WriteFrame(w io.Writer, typ byte, p []byte) error {
	buf := make([]byte, 5, 5+len(p))
	buf[0] = typ
	binary.BigEndian.PutUint32(buf[1:], uint32(len(p)))
	_, err := w.Write(append(buf, p...))
	return err
}

// readFrame reads one frame of at most maxFrame bytes into buf (grown as
// needed) and returns its type and payload, which aliases buf.
func ReadFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	return ReadFrameMax(r, buf, MaxFrame)
}

func ReadFrameMax(r io.Reader, buf []byte, limit uint32) (byte, []byte, error) {
	typ, n, err := ReadFrameHeader(r, limit)
	if err != nil {
		return 0, nil, err
	}
	buf, err = ReadPayload(r, buf, n)
	if err != nil {
		return 0, nil, err
	}
	return typ, buf, nil
}

// readFrameHeader reads a frame's type and the length of its payload; a
// length over limit is a *ProtocolError.
func ReadFrameHeader(r io.Reader, limit uint32) (byte, int, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > limit {
		return 0, 0, ProtocolErrorf("frame length %d over %d", n, limit)
	}
	return h[0], int(n), nil
}

// The error kinds on the wire, and back.
var kinds = map[string]error{
	"invalid":     providers.ErrInvalid,
	"not_found":   providers.ErrNotFound,
	"conflict":    providers.ErrConflict,
	"too_many":    providers.ErrTooMany,
	"unsupported": providers.ErrUnsupported,
	"forbidden":   providers.ErrForbidden,
	"too_large":   providers.ErrTooLarge,
}

func KindOf(err error) string {
	k := providers.Kind(err)
	for name, e := range kinds {
		if k == e {
			return name
		}
	}
	return ""
}

func ErrorReply(err error) Reply {
	k := KindOf(err)
	if k == "" {
		return Reply{Error: err.Error()}
	}
	return Reply{Error: providers.Message(err), Kind: k}
}

// remoteError is an error the agent reported, with its kind.
func RemoteError(msg, kind string) error {
	if k, ok := kinds[kind]; ok {
		return providers.Errorf(k, "%s", msg)
	}
	return errors.New(msg)
}

// DefaultRing is the output a session retains when the gateway does not
// say (SPEC §7: the last 1 MiB).
const DefaultRing = 1 << 20

// ExitInfo is the payload of an exit frame.
type ExitInfo struct {
	Code int  `json:"code"`
	Lost bool `json:"lost,omitempty"`
}

// CoalesceTTY is the most output a terminal session's frame gathers
// before it is sent (the agent's coalescing; the gateway sizes its frame
// buffers by it).
const CoalesceTTY = 128 << 10
