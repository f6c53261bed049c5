package handlers

import (
	"bufio"
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// execRun runs an exec as its reply is written, so that the reply can
// start before the command ends: once the command runs (the provider
// calls Started), the status 200 and the command's id (X-Command-Id) go
// out, then a space every heartbeat period while it runs (leading
// whitespace is legal JSON, and a proxy that cuts idle connections sees
// traffic), then the result as execReply writes it. A command that ends
// within a period gets exactly execReply's body. An error before the
// start keeps its status; one after it (the sandbox stopped meanwhile) is
// a sandbox failure result. The client going away leaves the command
// running unless the request said kill_on_disconnect.
type execRun struct {
	s   *server
	ctx context.Context
	id  string
	req sandbox.ExecRequest
}

var _ api.ExecCommandResponseObject = execRun{}

func (e execRun) VisitExecCommandResponse(w http.ResponseWriter) error {
	pw := newProgressWriter(w, e.s.replyTimeout)
	var hb *heartbeat
	e.req.Started = func(cid string) {
		w.Header().Set(commandIDHeader, cid)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		pw.flush()
		hb = startHeartbeat(pw, e.s.heartbeat, []byte(" "), nil)
	}
	res, err := e.s.svc.Exec(e.ctx, callerFrom(e.ctx), e.id, e.req)
	if hb == nil {
		if err != nil {
			return err
		}
		return execReply{res, e.s.replyTimeout}.VisitExecCommandResponse(w)
	}
	hb.end()
	if err != nil {
		if e.ctx.Err() != nil {
			// The client went; the command runs on unless it asked otherwise.
			e.s.log.Debug("client gone during exec", "sandbox", e.id, "err", err)
			return nil
		}
		e.s.log.Warn("exec failed after it started", "sandbox", e.id, "err", err)
		res = sandbox.FailedResult(err)
	}
	defer res.Release()
	if err := writeExecResult(pw, res); err != nil {
		return err
	}
	return pw.flush()
}

// commandIDHeader names the durable command that runs an exec.
const commandIDHeader = "X-Command-Id"

// execReply renders an exec result as api.ExecResult JSON, escaping the
// output straight onto the connection: the generated response would
// encode the whole reply into one buffer first, and a stream of NULs
// escapes to six times its size. Visiting it releases the result's output
// budget, whether or not the write succeeded: once the reply is out, or
// once the client has taken nothing of it for stall (its connection is
// then closed), so a client that never reads holds the budget no longer.
type execReply struct {
	res   sandbox.ExecResult
	stall time.Duration
}

var _ api.ExecCommandResponseObject = execReply{}

func (e execReply) VisitExecCommandResponse(w http.ResponseWriter) error {
	defer e.res.Release()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	pw := newProgressWriter(w, e.stall)
	if err := writeExecResult(pw, e.res); err != nil {
		return err
	}
	return pw.flush()
}

// writeExecResult writes res as encoding/json writes api.ExecResult (the
// same fields in the same order, the same escapes), each stream made valid
// UTF-8 as strings.ToValidUTF8 does: every run of invalid bytes becomes
// one U+FFFD. It holds no copy of the output beyond a 32 KiB buffer.
func writeExecResult(w io.Writer, res sandbox.ExecResult) error {
	bw := bufio.NewWriterSize(w, 32<<10)
	var num [24]byte
	bw.WriteByte('{')
	if u := res.Usage; u != nil {
		bw.WriteString(`"cpu_time_s":`)
		bw.Write(appendJSONFloat(num[:0], u.CPUTime.Seconds()))
		bw.WriteByte(',')
	}
	bw.WriteString(`"duration_ms":`)
	bw.Write(strconv.AppendInt(num[:0], res.Duration.Milliseconds(), 10))
	bw.WriteString(`,"error_type":`)
	if res.ErrorType == "" {
		bw.WriteString("null")
	} else if err := writeJSONString(bw, []byte(res.ErrorType)); err != nil {
		return err
	}
	if u := res.Usage; u != nil {
		bw.WriteString(`,"oom_killed":`)
		bw.WriteString(strconv.FormatBool(u.OOMKilled))
		bw.WriteString(`,"peak_memory_mib":`)
		bw.Write(appendJSONFloat(num[:0], float64(u.PeakMemory)/(1<<20)))
	}
	bw.WriteString(`,"return_code":`)
	bw.Write(strconv.AppendInt(num[:0], int64(res.ReturnCode), 10))
	bw.WriteString(`,"stderr":`)
	if err := writeJSONString(bw, res.Stderr); err != nil {
		return err
	}
	bw.WriteString(`,"stdout":`)
	if err := writeJSONString(bw, res.Stdout); err != nil {
		return err
	}
	bw.WriteString(`,"truncated":`)
	bw.WriteString(strconv.FormatBool(res.Truncated))
	bw.WriteString("}\n")
	return bw.Flush()
}

// appendJSONFloat appends f as encoding/json writes a float64: the
// shortest decimal, in exponent form (with at least two exponent digits
// dropped to one, e-07 as e-7) only below 1e-6 or from 1e21. f is finite.
func appendJSONFloat(b []byte, f float64) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// asciiEscape is how encoding/json writes each ASCII byte: nil for the
// bytes it writes as they are, else the escape. It escapes control
// characters, quote and backslash, and <, > and & (for HTML).
var asciiEscape = func() (t [utf8.RuneSelf][]byte) {
	const hex = "0123456789abcdef"
	for c := range byte(0x20) {
		t[c] = []byte{'\\', 'u', '0', '0', hex[c>>4], hex[c&0xf]}
	}
	for c, e := range map[byte]string{'\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`, '"': `\"`, '\\': `\\`, '<': `\u003c`, '>': `\u003e`, '&': `\u0026`} {
		t[c] = []byte(e)
	}
	return t
}()

var (
	replacement  = []byte("\uFFFD")
	lineSep      = []byte(`\u2028`)
	paragraphSep = []byte(`\u2029`)
)

// writeJSONString writes b as a JSON string (see writeExecResult). Runs
// of bytes that need no escaping are written without copying; the first
// write error stops it.
func writeJSONString(w *bufio.Writer, b []byte) error {
	if err := w.WriteByte('"'); err != nil {
		return err
	}
	start := 0 // b[start:i] is pending, to be written as it is
	for i := 0; i < len(b); {
		var rep []byte // what b[i:i+n] is written as
		n := 1
		if c := b[i]; c < utf8.RuneSelf {
			if rep = asciiEscape[c]; rep == nil {
				i++
				continue
			}
		} else {
			r, size := utf8.DecodeRune(b[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				// One U+FFFD for the whole run of invalid bytes.
				for i+n < len(b) {
					if r, size := utf8.DecodeRune(b[i+n:]); r != utf8.RuneError || size != 1 {
						break
					}
					n++
				}
				rep = replacement
			case r == '\u2028':
				rep, n = lineSep, size
			case r == '\u2029':
				rep, n = paragraphSep, size
			default:
				i += size
				continue
			}
		}
		if start < i {
			if _, err := w.Write(b[start:i]); err != nil {
				return err
			}
		}
		if _, err := w.Write(rep); err != nil {
			return err
		}
		i += n
		start = i
	}
	if _, err := w.Write(b[start:]); err != nil {
		return err
	}
	return w.WriteByte('"')
}
