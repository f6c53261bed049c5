package handlers

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

const testKey2 = "test-key-2"

func twoKeys(o *sandbox.Options) { o.APIKeys = []string{testKey, testKey2} }

func key2() map[string]string { return map[string]string{"Authorization": "Bearer " + testKey2} }

// pending is a request whose body the test sends a prefix of and holds
// open: an answer can come only from a gateway that did not wait for it.
type pending struct {
	body *io.PipeWriter
	res  chan *http.Response
	err  chan error
}

// startPending sends method path with hdr and a body of declared length
// n (-1: chunked) of which only prefix is written.
func (g *gw) startPending(method, path string, hdr map[string]string, n int64, prefix string) *pending {
	g.t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(method, g.srv.URL+path, pr)
	if err != nil {
		g.t.Fatal(err)
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	p := &pending{body: pw, res: make(chan *http.Response, 1), err: make(chan error, 1)}
	go func() {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			p.err <- err
			return
		}
		p.res <- res
	}()
	go pw.Write([]byte(prefix)) // blocks until the transport takes it: never, if it never asks
	g.t.Cleanup(func() { pw.CloseWithError(errors.New("test over")) })
	return p
}

// answer waits for the response (bounded only to catch a hang) and
// returns it read.
func (p *pending) answer(t *testing.T) resp {
	t.Helper()
	select {
	case res := <-p.res:
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return resp{res.StatusCode, res.Header, b}
	case err := <-p.err:
		t.Fatalf("request failed: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no answer while the body was held: the gateway waits for a body it should not read")
	}
	return resp{}
}

// TestAuthenticatedBeforeBodyRead: every credential is verified before the
// body is read: a request whose body never ends is answered 401, 403 or
// 404 all the same, on the JSON routes, the proxy and create.
func TestAuthenticatedBeforeBodyRead(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{})
	b := g.create(map[string]any{})
	forged := "sgl1." + base64.RawURLEncoding.EncodeToString([]byte(a.SandboxID+"|ls-x|owner|0")) + ".AAAA"
	unknown := "sbx-" + strings.Repeat("b", 20)
	for _, c := range []struct {
		name, method, path string
		hdr                map[string]string
		n                  int64
		want               int
	}{
		{"exec, forged lease", "POST", "/v1/sandboxes/" + a.SandboxID + "/exec", lease(forged), 60 << 20, 401},
		{"exec, no credential, chunked", "POST", "/v1/sandboxes/" + a.SandboxID + "/exec", nil, -1, 401},
		{"upload, another sandbox's lease", "POST", "/v1/sandboxes/" + a.SandboxID + "/upload", lease(b.Token), 60 << 20, 403},
		{"exec, unknown sandbox, API key", "POST", "/v1/sandboxes/" + unknown + "/exec", key(), 1 << 20, 404},
		{"create, no key", "POST", "/v1/sandboxes", nil, 60 << 20, 401},
		{"create, a lease for a key", "POST", "/v1/sandboxes", map[string]string{"Authorization": "Bearer " + a.Token}, -1, 401},
		{"create, unknown key", "POST", "/v1/sandboxes", map[string]string{"Authorization": "Bearer nope"}, -1, 401},
		{"proxy, forged lease", "POST", "/v1/sandboxes/" + a.SandboxID + "/proxy/8080/x", lease(forged), -1, 401},
		{"put file, forged lease", "PUT", "/v1/sandboxes/" + a.SandboxID + "/files?path=f", lease(forged), -1, 401},
	} {
		t.Run(c.name, func(t *testing.T) {
			// More than the client's buffer: the headers must go out.
			r := g.startPending(c.method, c.path, c.hdr, c.n, `{"command": "`+strings.Repeat("x", 64<<10)).answer(t)
			if r.status != c.want {
				t.Fatalf("status %d, want %d: %s", r.status, c.want, r.body)
			}
			r.problem(t)
		})
	}
	if n := len(must(g.p.List(nil))); n != 2 {
		t.Fatalf("%d sandboxes, want the 2 made", n)
	}
}

// TestBodyCaps: JSON bodies are capped at MaxJSONBody, the base64 upload's
// at MaxUploadBody: an oversize declared length is refused (413) before
// the body is read, an oversize chunked body as it is read; nothing
// changes. The upload takes more than a JSON body.
func TestBodyCaps(t *testing.T) {
	g := newGatewayOpts(t, Options{MaxUploadBody: 2 << 20})
	a := g.create(map[string]any{})
	big := `{"metadata": {"a": "` + strings.Repeat("x", 1<<20) + `"}}`
	for _, c := range []struct {
		name, method, path string
		hdr                map[string]string
		n                  int64
	}{
		{"create, 2 MiB declared", "POST", "/v1/sandboxes", key(), 2 << 20},
		{"exec, 2 MiB declared", "POST", "/v1/sandboxes/" + a.SandboxID + "/exec", lease(a.Token), 2 << 20},
		{"upload, 3 MiB declared", "POST", "/v1/sandboxes/" + a.SandboxID + "/upload", lease(a.Token), 3 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := g.startPending(c.method, c.path, c.hdr, c.n, `{"x": "`).answer(t)
			if r.status != http.StatusRequestEntityTooLarge || r.problem(t).Code != "too_large" {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		})
	}
	// Chunked: cut as it is read.
	req, _ := http.NewRequest("POST", g.srv.URL+"/v1/sandboxes", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked create over the cap: %d", res.StatusCode)
	}
	if n := len(must(g.p.List(nil))); n != 1 {
		t.Fatalf("%d sandboxes after the refused creates, want 1", n)
	}
	// The upload may carry more than a JSON body.
	data := bytes.Repeat([]byte("y"), 1200<<10)
	r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/upload",
		map[string]any{"target_path": "big.txt", "contents_b64": base64.StdEncoding.EncodeToString(data)}, lease(a.Token))
	if r.status != 200 {
		t.Fatalf("1.2 MiB upload: %d %s", r.status, r.body)
	}
	if got := g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/files?path=big.txt", nil, lease(a.Token)); !bytes.Equal(got.body, data) {
		t.Fatalf("uploaded file: %d bytes", len(got.body))
	}
}

// TestBodyBudget: one key's bodies in flight may take a quarter of
// MaxBodyInflight; beyond it that key's next body is refused 503 with
// Retry-After (before reading when its length is known, as it is read
// when not) while another key's is served, and the room comes back when
// the first body is done.
func TestBodyBudget(t *testing.T) {
	g := newGatewayOpts(t, Options{MaxUploadBody: 2 << 20, MaxBodyInflight: 4 << 20}, twoKeys)
	a := g.create(map[string]any{})
	r := g.do("POST", "/v1/sandboxes", map[string]any{}, key2())
	if r.status != 201 {
		t.Fatalf("create with the second key: %d %s", r.status, r.body)
	}
	var b ref
	r.json(t, &b)
	upload := func(name string, n int) string {
		return `{"target_path": "` + name + `", "contents_b64": "` + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("z"), n)) + `"}`
	}
	path := func(id string) string { return "/v1/sandboxes/" + id + "/upload" }

	held := upload("held.txt", 600<<10)     // 800 KiB of the key's 1 MiB
	second := upload("second.txt", 200<<10) // 266 KiB more: over the share
	var open *pending
	// Until the held body is admitted, the second upload goes through; a
	// held body that came while a second one held the room is refused
	// (on a loaded machine): it is held again.
	testkit.Eventually(t, "the second upload to be refused while one is held", 20*time.Second, func() bool {
		if open != nil {
			select {
			case res := <-open.res:
				res.Body.Close()
				open = nil
			case <-open.err:
				open = nil
			default:
			}
		}
		if open == nil {
			open = g.startPending("POST", path(a.SandboxID), lease(a.Token), int64(len(held)), held[:100])
		}
		r = g.do("POST", path(a.SandboxID), second, lease(a.Token))
		if r.status != 200 && r.status != http.StatusServiceUnavailable {
			t.Fatalf("second upload of the key while one is held: %d %s", r.status, r.body)
		}
		return r.status == http.StatusServiceUnavailable
	})
	if r.header.Get("Retry-After") == "" || r.problem(t).Code != "unavailable" {
		t.Fatalf("503 without Retry-After or problem: %v %s", r.header, r.body)
	}
	// Not known in advance: refused as it is read.
	req, _ := http.NewRequest("POST", g.srv.URL+path(a.SandboxID), io.MultiReader(strings.NewReader(second)))
	req.Header.Set("X-Sandbox-Lease", a.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("chunked upload over the key's share: %d", res.StatusCode)
	}
	// Another key is served meanwhile.
	if r := g.do("POST", path(b.SandboxID), second, lease(b.Token)); r.status != 200 {
		t.Fatalf("the other key's upload: %d %s", r.status, r.body)
	}
	// The held body ends: its room comes back.
	io.WriteString(open.body, held[100:])
	open.body.Close()
	if r := open.answer(t); r.status != 200 {
		t.Fatalf("held upload: %d %s", r.status, r.body)
	}
	if r := g.do("POST", path(a.SandboxID), second, lease(a.Token)); r.status != 200 {
		t.Fatalf("after the held body was done: %d %s", r.status, r.body)
	}
}

// TestBodyBudgetLimits: the gateway-wide bound and the per-key share, and
// room given back.
func TestBodyBudgetLimits(t *testing.T) {
	b := newBodyBudget(400)
	for i, k := range []string{"a", "b", "c", "d"} {
		if err := b.take(k, 100); err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
	}
	if err := b.take("e", 1); !errors.Is(err, errBodiesBusy) {
		t.Fatalf("over the total: %v", err)
	}
	b.give("d", 100)
	if err := b.take("a", 1); !errors.Is(err, errKeyBodiesBusy) {
		t.Fatalf("over a's share: %v", err)
	}
	if err := b.take("e", 100); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c", "e"} {
		b.give(k, 100)
	}
	if all, a := b.inUse("a"); all != 0 || a != 0 || len(b.byKey) != 0 {
		t.Fatalf("after giving all back: %d, %d, %v", all, a, b.byKey)
	}
}

// TestBodyTimeout: a JSON body that does not arrive within BodyTimeout is
// answered 408 and nothing runs; an exec that runs longer than
// BodyTimeout once its body is in still completes.
func TestBodyTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	g := newGatewayOpts(t, Options{BodyTimeout: timeout})
	a := g.create(map[string]any{})
	var ran atomic.Int32
	g.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		ran.Add(1)
		select {
		case <-time.After(4 * timeout): // longer than the body's bound
		case <-ctx.Done():
			return providers.ExecResult{}, ctx.Err()
		}
		return providers.ExecResult{Stdout: []byte("done")}, nil
	}
	r := g.startPending("POST", "/v1/sandboxes/"+a.SandboxID+"/exec", lease(a.Token), -1, `{"command": "`+strings.Repeat("x", 64<<10)).answer(t)
	if r.status != http.StatusRequestTimeout || ran.Load() != 0 {
		t.Fatalf("stalled body: %d %s (ran %d)", r.status, r.body, ran.Load())
	}
	r = g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/exec", map[string]any{"command": "slow"}, lease(a.Token))
	var res api.ExecResult
	if r.json(t, &res); r.status != 200 || res.Stdout != "done" {
		t.Fatalf("exec longer than the body timeout: %d %s", r.status, r.body)
	}
}

// rawExec sends an exec over a connection of its own, with a small
// receive buffer, and never reads the reply.
func rawExec(t *testing.T, g *gw, id, tok, command string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(g.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	body := `{"command": "` + command + `"}`
	fmt.Fprintf(c, "POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nX-Sandbox-Lease: %s\r\nContent-Length: %d\r\n\r\n%s",
		id, tok, len(body), body)
	return c
}

// nulsOrBig answers "nuls" with both streams full of NULs (each escapes to
// six bytes: a reply far larger than the sockets buffer) and "big" with
// 4,000,000 printable bytes.
func nulsOrBig(started *atomic.Int32) func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	return func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		if req.Command == "big" { // cut at the cap granted, as providers do
			out := bytes.Repeat([]byte("x"), 4_000_000)
			return providers.ExecResult{Stdout: out[:min(len(out), req.MaxOutput)], Truncated: len(out) > req.MaxOutput}, nil
		}
		started.Add(1)
		out := make([]byte, req.MaxOutput)
		return providers.ExecResult{Stdout: out, Stderr: out, Truncated: req.MaxOutput < 4<<20}, nil
	}
}

// TestSlowReadersOfOneKeyNeverTruncateAnother: ten execs of key A whose
// replies are never read hold A's output budget; key B's 4 MB exec comes
// back whole.
func TestSlowReadersOfOneKeyNeverTruncateAnother(t *testing.T) {
	g := newGateway(t, 0, twoKeys, func(o *sandbox.Options) {
		o.MaxExecOutput = 4 << 20
		o.MaxExecOutputTotal = 16 << 20
	})
	a := g.create(map[string]any{})
	r := g.do("POST", "/v1/sandboxes", map[string]any{}, key2())
	var b ref
	r.json(t, &b)
	var started atomic.Int32
	g.p.ExecFunc = nulsOrBig(&started)
	for range 10 {
		rawExec(t, g, a.SandboxID, a.Token, "nuls")
	}
	testkit.Eventually(t, "A's ten execs holding A's whole budget", 20*time.Second, func() bool {
		return started.Load() == 10 && g.svc.OutputInUse() >= 16<<20
	})
	r = g.do("POST", "/v1/sandboxes/"+b.SandboxID+"/exec", map[string]any{"command": "big"}, lease(b.Token))
	var res api.ExecResult
	r.json(t, &res)
	if r.status != 200 || len(res.Stdout) != 4_000_000 || res.Truncated {
		t.Fatalf("key B's exec while A's replies are unread: %d, %d bytes, truncated %v", r.status, len(res.Stdout), res.Truncated)
	}
}

// TestStalledReplyReleasesItsOutput: an exec reply the client takes
// nothing of for ReplyTimeout has its connection closed and its output
// budget released.
func TestStalledReplyReleasesItsOutput(t *testing.T) {
	g := newGatewayOpts(t, Options{ReplyTimeout: 300 * time.Millisecond}, func(o *sandbox.Options) { o.MaxExecOutput = 4 << 20 })
	a := g.create(map[string]any{})
	var started atomic.Int32
	g.p.ExecFunc = nulsOrBig(&started)
	c := rawExec(t, g, a.SandboxID, a.Token, "nuls")
	testkit.Eventually(t, "the exec to hold its output", 20*time.Second, func() bool { return g.svc.OutputInUse() > 0 })
	testkit.Eventually(t, "the stalled reply's output to be released", 20*time.Second, func() bool { return g.svc.OutputInUse() == 0 })
	// The gateway closed the connection (the client never did).
	testkit.Eventually(t, "the stalled reply's connection to be closed", 20*time.Second, func() bool { return g.closedConns.Load() > 0 })
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(io.Discard, io.LimitReader(c, 64<<10)); err != nil {
		t.Fatalf("reading what the reply sent before it was cut: %v", err)
	}
}

// TestReplyDeadlineNotInherited: the write deadline an exec reply leaves
// on its connection does not cut the next request's reply on it.
func TestReplyDeadlineNotInherited(t *testing.T) {
	const stall = 200 * time.Millisecond
	g := newGatewayOpts(t, Options{ReplyTimeout: stall})
	a := g.create(map[string]any{})
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1}}
	defer client.CloseIdleConnections()
	do := func(req *http.Request) (*http.Response, bool) {
		var reused bool
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return res, reused
	}
	req, _ := http.NewRequest("POST", g.srv.URL+"/v1/sandboxes/"+a.SandboxID+"/exec", strings.NewReader(`{"command": "true"}`))
	req.Header.Set("X-Sandbox-Lease", a.Token)
	req.Header.Set("Content-Type", "application/json")
	res, _ := do(req)
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	// A streamed upload that ends well past the exec reply's deadline.
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte("first part "))
		<-time.After(3 * stall) // the time passing is the point
		pw.Write([]byte("last part"))
		pw.Close()
	}()
	req, _ = http.NewRequest("PUT", g.srv.URL+"/v1/sandboxes/"+a.SandboxID+"/files?path=f.txt", pr)
	req.Header.Set("X-Sandbox-Lease", a.Token)
	req.Header.Set("Content-Type", "application/octet-stream")
	res, reused := do(req)
	b, err := io.ReadAll(bufio.NewReader(res.Body))
	res.Body.Close()
	if !reused {
		t.Fatal("the upload did not reuse the exec's connection: the test shows nothing")
	}
	if err != nil || res.StatusCode != 200 || !strings.Contains(string(b), `"size":20`) {
		t.Fatalf("upload after an exec reply on the same connection: %d %q %v", res.StatusCode, b, err)
	}
}
