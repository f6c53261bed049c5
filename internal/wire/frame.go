package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// Mode is a session's terminal mode, as the API names it.
type Mode string

// The modes.
const (
	ModePTY  Mode = "pty"  // a terminal: all output on channel 0x01
	ModePipe Mode = "pipe" // three pipes: stdout 0x01, stderr 0x02
)

// The frame codec of the attach protocol (OpenSandbox execd compatible).
// Binary frames start with a channel byte; text frames are JSON objects
// with a "type".

// Channel bytes: the first byte of every binary frame.
const (
	ChanStdin  byte = 0x00 // client -> server: stdin bytes
	ChanOutput byte = 0x01 // server -> client: all output in PTY mode, stdout in pipe mode
	ChanStderr byte = 0x02 // server -> client: stderr (pipe mode)
	ChanReplay byte = 0x03 // server -> client: 0x03, 8-byte big-endian offset, bytes
)

// ReplayHeader is the length of a replay frame's header.
const ReplayHeader = 1 + 8

// Codes of the error frame {"type":"error","code","error"}.
const (
	CodeInvalidFrame   = "INVALID_FRAME"   // not JSON, or a field of the wrong type or range
	CodeUnknownType    = "UNKNOWN_TYPE"    // a JSON frame of a type the server does not know
	CodeUnknownChannel = "UNKNOWN_CHANNEL" // a binary frame whose first byte is not 0x00
	CodeUnknownSignal  = "UNKNOWN_SIGNAL"  // a signal that is not one of SIGINT, SIGTERM, SIGKILL, SIGQUIT, SIGHUP
	CodeFrameTooLarge  = "FRAME_TOO_LARGE" // a frame over the read limit (it was discarded)
	CodeUnsupported    = "UNSUPPORTED"     // e.g. resize in pipe mode
	CodeInputFailed    = "INPUT_FAILED"    // stdin, resize or signal failed (the process is gone)
	CodeSessionGone    = "SESSION_GONE"    // the session was deleted or its sandbox removed
)

// Signals are the signals a client may send, by name.
var Signals = map[string]syscall.Signal{
	"SIGINT":  syscall.SIGINT,
	"SIGTERM": syscall.SIGTERM,
	"SIGKILL": syscall.SIGKILL,
	"SIGQUIT": syscall.SIGQUIT,
	"SIGHUP":  syscall.SIGHUP,
}

// MsgKind is the kind of a client frame.
type MsgKind int

// The client frame kinds.
const (
	MsgStdin  MsgKind = iota + 1 // binary 0x00 + bytes, or {"type":"stdin","data"}
	MsgResize                    // {"type":"resize","cols","rows"}
	MsgSignal                    // {"type":"signal","signal"}
	MsgPing                      // {"type":"ping"}
	MsgEOF                       // {"type":"eof"}
)

// ClientMsg is one decoded client frame.
type ClientMsg struct {
	Kind       MsgKind
	Data       []byte // MsgStdin; aliases the frame
	Rows, Cols uint16 // MsgResize
	Signal     syscall.Signal
}

// FrameError is a client frame the server refuses; it is answered with an
// error frame carrying Code and does not end the connection.
type FrameError struct {
	Code string
	Msg  string
}

func (e *FrameError) Error() string { return e.Code + ": " + e.Msg }

func frameErr(code, format string, args ...any) error {
	return &FrameError{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// clientJSON is a client text frame. Pointers tell absent from zero.
type clientJSON struct {
	Type   string  `json:"type"`
	Cols   *int64  `json:"cols"`
	Rows   *int64  `json:"rows"`
	Signal *string `json:"signal"`
	Data   *string `json:"data"`
}

// DecodeClient decodes one client frame (text: JSON; else binary). The
// error is a *FrameError. Data of a binary stdin frame aliases frame.
func DecodeClient(text bool, frame []byte) (ClientMsg, error) {
	if !text {
		if len(frame) == 0 {
			return ClientMsg{}, frameErr(CodeUnknownChannel, "empty binary frame: want 0x00 + stdin bytes")
		}
		if frame[0] != ChanStdin {
			return ClientMsg{}, frameErr(CodeUnknownChannel, "unknown channel 0x%02x: clients send 0x00 (stdin)", frame[0])
		}
		return ClientMsg{Kind: MsgStdin, Data: frame[1:]}, nil
	}
	var j clientJSON
	if err := json.Unmarshal(frame, &j); err != nil {
		return ClientMsg{}, frameErr(CodeInvalidFrame, "not a JSON object: %s", jsonProblem(err))
	}
	switch j.Type {
	case "stdin":
		if j.Data == nil {
			return ClientMsg{}, frameErr(CodeInvalidFrame, "stdin needs data")
		}
		return ClientMsg{Kind: MsgStdin, Data: []byte(*j.Data)}, nil
	case "resize":
		if j.Cols == nil || j.Rows == nil {
			return ClientMsg{}, frameErr(CodeInvalidFrame, "resize needs cols and rows")
		}
		if *j.Cols < 1 || *j.Cols > 65535 || *j.Rows < 1 || *j.Rows > 65535 {
			return ClientMsg{}, frameErr(CodeInvalidFrame, "cols and rows must be 1..65535")
		}
		return ClientMsg{Kind: MsgResize, Cols: uint16(*j.Cols), Rows: uint16(*j.Rows)}, nil
	case "signal":
		if j.Signal == nil {
			return ClientMsg{}, frameErr(CodeInvalidFrame, "signal needs signal")
		}
		name := *j.Signal
		if !strings.HasPrefix(name, "SIG") {
			name = "SIG" + name
		}
		sig, ok := Signals[name]
		if !ok {
			return ClientMsg{}, frameErr(CodeUnknownSignal, "unknown signal %q: want SIGINT, SIGTERM, SIGKILL, SIGQUIT or SIGHUP", Truncate(*j.Signal, 32))
		}
		return ClientMsg{Kind: MsgSignal, Signal: sig}, nil
	case "ping":
		return ClientMsg{Kind: MsgPing}, nil
	case "eof":
		return ClientMsg{Kind: MsgEOF}, nil
	case "":
		return ClientMsg{}, frameErr(CodeInvalidFrame, "frame has no type")
	default:
		return ClientMsg{}, frameErr(CodeUnknownType, "unknown type %q", Truncate(j.Type, 32))
	}
}

// jsonProblem describes a JSON error without echoing the input.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %q has the wrong type", te.Field)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}
	return "malformed JSON"
}

// Truncate shortens a client-supplied string to n bytes (and an ellipsis)
// for an error message.
func Truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// AppendReplay appends the replay frame for data starting at absolute
// offset off.
func AppendReplay(dst []byte, off int64, data []byte) []byte {
	dst = append(dst, ChanReplay)
	dst = binary.BigEndian.AppendUint64(dst, uint64(off))
	return append(dst, data...)
}

// ServerFrame is a decoded server binary frame.
type ServerFrame struct {
	Channel byte   // ChanOutput, ChanStderr or ChanReplay
	Offset  int64  // replay frames: the absolute offset of Data[0]
	Data    []byte // aliases the frame
}

// DecodeServer decodes a server binary frame (as a client does).
func DecodeServer(frame []byte) (ServerFrame, error) {
	if len(frame) == 0 {
		return ServerFrame{}, errors.New("empty frame")
	}
	switch frame[0] {
	case ChanOutput, ChanStderr:
		return ServerFrame{Channel: frame[0], Data: frame[1:]}, nil
	case ChanReplay:
		if len(frame) < ReplayHeader {
			return ServerFrame{}, fmt.Errorf("replay frame of %d bytes is shorter than its header", len(frame))
		}
		off := binary.BigEndian.Uint64(frame[1:ReplayHeader])
		if off > 1<<62 {
			return ServerFrame{}, fmt.Errorf("replay offset %d out of range", off)
		}
		return ServerFrame{Channel: ChanReplay, Offset: int64(off), Data: frame[ReplayHeader:]}, nil
	default:
		return ServerFrame{}, fmt.Errorf("unknown channel 0x%02x", frame[0])
	}
}

// ServerMsg is a server text frame.
type ServerMsg struct {
	Type      string `json:"type"` // connected, exit, error, pong
	SessionID string `json:"session_id,omitempty"`
	Mode      Mode   `json:"mode,omitempty"`
	ExitCode  *int   `json:"exit_code,omitempty"`
	Code      string `json:"code,omitempty"`
	Error     string `json:"error,omitempty"`
}

func encodeMsg(m ServerMsg) []byte {
	var b bytes.Buffer
	// Marshalling these fields cannot fail.
	json.NewEncoder(&b).Encode(m)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// ConnectedFrame is the text frame sent right after the replay frame.
func ConnectedFrame(sid string, mode Mode) []byte {
	return encodeMsg(ServerMsg{Type: "connected", SessionID: sid, Mode: mode})
}

// ExitFrame is the text frame sent when the process has exited.
func ExitFrame(code int) []byte {
	return encodeMsg(ServerMsg{Type: "exit", ExitCode: &code})
}

// ErrorFrame is an error text frame.
func ErrorFrame(code, msg string) []byte {
	return encodeMsg(ServerMsg{Type: "error", Code: code, Error: msg})
}

// PongFrame answers a client's {"type":"ping"}.
var PongFrame = []byte(`{"type":"pong"}`)
