package handlers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

// encodingJSON renders res the way the generated response did before the
// reply was streamed: the output made valid UTF-8 by strings.ToValidUTF8,
// then api.ExecResult through encoding/json.
func encodingJSON(t *testing.T, res sandbox.ExecResult) []byte {
	t.Helper()
	out := api.ExecResult{
		Stdout:     strings.ToValidUTF8(string(res.Stdout), "\uFFFD"),
		Stderr:     strings.ToValidUTF8(string(res.Stderr), "\uFFFD"),
		ReturnCode: res.ReturnCode,
		DurationMs: res.Duration.Milliseconds(),
		Truncated:  res.Truncated,
	}
	if res.ErrorType != "" {
		et := api.ExecErrorType(res.ErrorType)
		out.ErrorType = &et
	}
	if u := res.Usage; u != nil {
		cpu, mem, oom := u.CPUTime.Seconds(), float64(u.PeakMemory)/(1<<20), u.OOMKilled
		out.CPUTimeS, out.PeakMemoryMib, out.OomKilled = &cpu, &mem, &oom
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(out); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// randomOutput is n bytes drawn from pieces that exercise every escape
// and every kind of invalid UTF-8: ASCII, control and HTML characters,
// valid 2-4 byte runes (U+2028, U+2029 and U+FFFD among them), stray
// continuation bytes, truncated sequences, overlong forms and surrogates.
func randomOutput(r *rand.Rand, n int) []byte {
	pieces := []string{
		"a", "Z", " ", "~", "\x7f", "\"", "\\", "/", "<", ">", "&", "\x00", "\b", "\f", "\n", "\r", "\t", "\x01", "\x1f", "\x1b[0m",
		"é", "€", "😀", "\u2028", "\u2029", "\uFFFD", "\u00a0",
		"\x80", "\xbf", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xff", "\xfe", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
	}
	var b []byte
	for len(b) < n {
		if r.IntN(4) == 0 {
			b = append(b, byte(r.IntN(256)))
		} else {
			b = append(b, pieces[r.IntN(len(pieces))]...)
		}
	}
	return b[:n]
}

// TestExecReplyMatchesEncodingJSON: the streamed reply is byte for byte
// what encoding/json wrote, and decodes to the same strings, for random
// output including invalid UTF-8, small and larger than the write buffer.
func TestExecReplyMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 2, 3, 4, 7, 100, 1000}
	for range 3000 {
		sizes = append(sizes, r.IntN(300))
	}
	sizes = append(sizes, 32<<10-1, 32<<10, 32<<10+1, 200<<10)
	for i, n := range sizes {
		res := sandbox.ExecResult{
			Stdout:     randomOutput(r, n),
			Stderr:     randomOutput(r, r.IntN(n+1)),
			ReturnCode: r.IntN(256) - 1,
			Duration:   time.Duration(r.Int64N(int64(time.Hour))),
			Truncated:  r.IntN(2) == 0,
		}
		switch i % 3 {
		case 1:
			res.ErrorType = sandbox.ExecTimeout
		case 2:
			res.ErrorType = sandbox.ExecSandbox
		}
		if i%2 == 0 {
			// Accounting, with CPU times and sizes across the float
			// formats encoding/json switches between.
			res.Usage = &providers.ExecUsage{
				CPUTime:    time.Duration(r.Int64N(int64(time.Hour))) >> r.IntN(40),
				PeakMemory: r.Int64N(1<<40) >> r.IntN(40),
				OOMKilled:  r.IntN(2) == 0,
			}
		}
		var got bytes.Buffer
		if err := writeExecResult(&got, res); err != nil {
			t.Fatal(err)
		}
		want := encodingJSON(t, res)
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("output %q:\n got %q\nwant %q", res.Stdout, got.Bytes(), want)
		}
		var g, w api.ExecResult
		if err := json.Unmarshal(got.Bytes(), &g); err != nil {
			t.Fatalf("decode %q: %v", got.Bytes(), err)
		}
		json.Unmarshal(want, &w)
		if g.Stdout != w.Stdout || g.Stderr != w.Stderr || g.Stdout != strings.ToValidUTF8(string(res.Stdout), "\uFFFD") {
			t.Fatalf("decoded strings differ for %q", res.Stdout)
		}
	}
}

// failingWriter fails every write after the first n bytes.
type failingWriter struct{ n int }

var errBroken = errors.New("connection broken")

func (f *failingWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, errBroken
	}
	f.n -= len(p)
	return len(p), nil
}

// TestExecReplyStopsOnWriteError: a broken connection ends the rendering
// with its error, well before the output is used up.
func TestExecReplyStopsOnWriteError(t *testing.T) {
	out := make([]byte, 4<<20) // NULs: every byte escapes
	for _, n := range []int{0, 10, 100 << 10} {
		fw := &failingWriter{n: n}
		cw := &countingWriter{w: fw}
		err := writeExecResult(cw, sandbox.ExecResult{Stdout: out, Stderr: out})
		if !errors.Is(err, errBroken) || cw.calls > 20 {
			t.Fatalf("failing after %d bytes: %v after %d writes", n, err, cw.calls)
		}
	}
}

type countingWriter struct {
	w     io.Writer
	calls int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.calls++
	return c.w.Write(p)
}

// TestExecReplyReleasesBudget: an exec's output budget comes back once its
// reply is written, and also when the client goes away mid-reply.
func TestExecReplyReleasesBudget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		perStream int
		abandon   bool
	}{
		{"written", 256 << 10, false},
		// 4 MiB of NULs per stream is a 48 MiB reply: far more than the
		// sockets buffer, so the gateway is still writing when the client goes.
		{"abandoned", 4 << 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGateway(t, 0, func(o *sandbox.Options) {
				o.MaxExecOutput = tc.perStream
				o.MaxExecOutputTotal = 2 * int64(tc.perStream)
			})
			a := g.create(map[string]any{})
			g.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
				if req.Command == "grant" { // how much this exec was allowed to keep
					return providers.ExecResult{Stdout: []byte(strconv.Itoa(req.MaxOutput))}, nil
				}
				out := make([]byte, req.MaxOutput)
				return providers.ExecResult{Stdout: out, Stderr: out}, nil
			}
			path := "/v1/sandboxes/" + a.SandboxID + "/exec"
			grant := func() int {
				r := g.do("POST", path, map[string]any{"command": "grant"}, lease(a.Token))
				var res api.ExecResult
				r.json(t, &res)
				n, _ := strconv.Atoi(res.Stdout)
				return n
			}
			if !tc.abandon {
				for range 3 {
					r := g.do("POST", path, map[string]any{"command": "nuls"}, lease(a.Token))
					var res api.ExecResult
					r.json(t, &res)
					if r.status != 200 || len(res.Stdout) != tc.perStream || len(res.Stderr) != tc.perStream || res.Truncated {
						t.Fatalf("exec: %d, %d/%d bytes", r.status, len(res.Stdout), len(res.Stderr))
					}
					// Had the reply kept its room, this would get the 64 KiB floor.
					if got := grant(); got != tc.perStream {
						t.Fatalf("after a written reply the next exec may keep %d bytes, want %d", got, tc.perStream)
					}
				}
				return
			}
			req, _ := http.NewRequest("POST", g.srv.URL+path, strings.NewReader(`{"command":"nuls"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Sandbox-Lease", a.Token)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			head, _ := bufio.NewReader(res.Body).Peek(64)
			if !bytes.HasPrefix(head, []byte(`{"duration_ms":`)) {
				t.Fatalf("reply starts %q", head)
			}
			if got := grant(); got == tc.perStream {
				t.Fatal("the reply being written holds no room")
			}
			res.Body.Close() // unread: the transport closes the connection
			testkit.Eventually(t, "the room of an abandoned reply to come back", 20*time.Second, func() bool { return grant() == tc.perStream })
		})
	}
}
