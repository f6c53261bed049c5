package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/testkit"
)

// nulFlood writes 16 MiB of NULs to stdout and 16 MiB to stderr: each NUL
// is six bytes of JSON (\u0000), so the reply is 192 MiB.
const nulFlood = "head -c 16M /dev/zero; head -c 16M /dev/zero >&2"

type execReply struct {
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	ReturnCode int     `json:"return_code"`
	ErrorType  *string `json:"error_type"`
	Truncated  bool    `json:"truncated"`
}

// execJSON runs command in the sandbox and decodes the reply, which must
// be one JSON value and nothing else.
func execJSON(ctx context.Context, base, id, tok, command string) (int, execReply, error) {
	body, _ := json.Marshal(map[string]any{"command": command})
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/sandboxes/"+id+"/exec", bytes.NewReader(body))
	if err != nil {
		return 0, execReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sandbox-Lease", tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, execReply{}, err
	}
	defer res.Body.Close()
	var out execReply
	reply, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, out, err
	}
	dec := json.NewDecoder(bytes.NewReader(squeezeNULs(reply)))
	if err := dec.Decode(&out); err != nil {
		return res.StatusCode, out, err
	}
	if dec.More() {
		return res.StatusCode, out, errors.New("data after the JSON value")
	}
	out.Stdout, out.Stderr = expandNULs(out.Stdout), expandNULs(out.Stderr)
	return res.StatusCode, out, nil
}

// A reply of megabytes of escaped NULs (\u0000, six bytes each) decoded
// byte by byte under -race takes a core for a minute. squeezeNULs writes
// each run of them as one marker, \u0001<count>\u0001, measured with
// whole-chunk compares, and expandNULs turns a decoded marker back into
// the run: the same reply, exactly, in a fraction of the time. (The
// commands these tests run write neither \x01 nor a backslash.)
func squeezeNULs(body []byte) []byte {
	const esc = `\u0000`
	chunk := bytes.Repeat([]byte(esc), 4096)
	var out []byte
	for {
		i := bytes.Index(body, []byte(esc))
		if i < 0 {
			return append(out, body...)
		}
		out, body = append(out, body[:i]...), body[i:]
		n := 0
		for len(body) >= len(chunk) && bytes.Equal(body[:len(chunk)], chunk) {
			n, body = n+len(chunk)/len(esc), body[len(chunk):]
		}
		for bytes.HasPrefix(body, []byte(esc)) {
			n, body = n+1, body[len(esc):]
		}
		out = fmt.Appendf(out, `\u0001%d\u0001`, n)
	}
}

func expandNULs(s string) string {
	var b strings.Builder
	for {
		before, rest, ok := strings.Cut(s, "\x01")
		b.WriteString(before)
		if !ok {
			return b.String()
		}
		count, after, ok := strings.Cut(rest, "\x01")
		n, err := strconv.Atoi(count)
		if !ok || err != nil {
			panic("expandNULs: a \\x01 in the reply that squeezeNULs did not write")
		}
		b.WriteString(strings.Repeat("\x00", n))
		s = after
	}
}

func newLocalSandbox(t *testing.T, g *proc) (id, tok string) {
	t.Helper()
	s, body := call(t, "POST", g.URL+"/v1/sandboxes", `{}`)
	var ref struct {
		ID  string `json:"sandbox_id"`
		Tok string `json:"lease_token"`
	}
	if err := json.Unmarshal(body, &ref); s != 201 || err != nil {
		t.Fatalf("create: %d %s", s, body)
	}
	return ref.ID, ref.Tok
}

func allNUL(s string) bool { return strings.Trim(s, "\x00") == "" }

// TestExecOutputBoundedMemory: 16 MiB of NULs on each stream through a real
// gateway (a 192 MiB reply) comes back whole and exact, and the gateway
// never holds the reply: its peak RSS stays far below the reply's size.
// (Rendered in one buffer as before, the same exec took it past 900 MB.)
func TestExecOutputBoundedMemory(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	id, tok := newLocalSandbox(t, g)
	// Catches a hang only: decoding the reply under -race takes a minute
	// or more on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	status, res, err := execJSON(ctx, g.URL, id, tok, nulFlood)
	if err != nil || status != 200 {
		t.Fatalf("exec: %d %v\n%s", status, err, g.stderr)
	}
	if len(res.Stdout) != 16<<20 || len(res.Stderr) != 16<<20 || !allNUL(res.Stdout) || !allNUL(res.Stderr) ||
		res.Truncated || res.ReturnCode != 0 || res.ErrorType != nil {
		t.Fatalf("reply: stdout %d bytes, stderr %d, truncated %v, rc %d", len(res.Stdout), len(res.Stderr), res.Truncated, res.ReturnCode)
	}
	const bound = 200 << 20
	hwm := peakRSS(t, g.cmd.Process.Pid)
	t.Logf("gateway peak RSS %d MiB for a 192 MiB reply", hwm>>20)
	if hwm > bound {
		t.Fatalf("gateway peak RSS %d MiB, over %d MiB", hwm>>20, bound>>20)
	}
}

// TestExecOutputBudget: eight such execs at once against a total budget
// of 8 MiB all answer 200, each cut to what the budget let it keep (the
// same length on both streams, between the 64 KiB floor and half the
// budget), and the gateway's memory stays bounded. The budget and a
// memory limit given through the environment both reach the gateway.
func TestExecOutputBudget(t *testing.T) {
	t.Parallel()
	const total, floor, n = 8 << 20, 64 << 10, 8
	g := startGateway(t, t.TempDir(), []string{"SANDGATE_MEMORY_LIMIT=1GiB"}, "--max-exec-output-total", "8388608")
	// The log is copied from the process's pipe.
	testkit.EventuallyNil(t, "SANDGATE_MEMORY_LIMIT=1GiB in effect", 10*time.Second, func() error {
		if log := g.stderr.String(); !strings.Contains(log, "memory_limit=1073741824") {
			return errors.New(log)
		}
		return nil
	})
	id, tok := newLocalSandbox(t, g)
	// Catches a hang only, as in TestExecOutputBoundedMemory.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	type answer struct {
		status int
		res    execReply
		err    error
	}
	answers := make(chan answer, n)
	for range n {
		go func() {
			status, res, err := execJSON(ctx, g.URL, id, tok, nulFlood)
			answers <- answer{status, res, err}
		}()
	}
	for range n {
		a := <-answers
		if a.err != nil || a.status != 200 {
			t.Fatalf("exec: %d %v\n%s", a.status, a.err, g.stderr)
		}
		r := a.res
		if !r.Truncated || len(r.Stdout) != len(r.Stderr) || len(r.Stdout) < floor || len(r.Stdout) > total/2 ||
			!allNUL(r.Stdout) || !allNUL(r.Stderr) || r.ReturnCode != 0 {
			t.Fatalf("reply: stdout %d bytes, stderr %d, truncated %v, rc %d", len(r.Stdout), len(r.Stderr), r.Truncated, r.ReturnCode)
		}
		t.Logf("kept %d KiB per stream", len(r.Stdout)>>10)
	}
	const bound = 100 << 20
	hwm := peakRSS(t, g.cmd.Process.Pid)
	t.Logf("gateway peak RSS %d MiB for %d execs at once", hwm>>20, n)
	if hwm > bound {
		t.Fatalf("gateway peak RSS %d MiB, over %d MiB", hwm>>20, bound>>20)
	}
}
