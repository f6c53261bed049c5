package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
)

// stalePauseDaemon is the real daemon behind a proxy that plays dockerd's
// late pause event: containerd's event for a pause can reach dockerd after
// the unpause that followed it, and dockerd then marks the running
// container paused until the resume's event arrives. After each unpause
// the proxy answers the from-th to the to-th inspection (counting from 1)
// with State.Paused set.
type stalePauseDaemon struct {
	host     string
	from, to int

	mu     sync.Mutex
	seen   int // inspections since the last unpause; -1 before one
	served int // stale answers given
}

var (
	unpausePath = regexp.MustCompile(`^(/v[0-9.]+)?/containers/[^/]+/unpause$`)
	inspectPath = regexp.MustCompile(`^(/v[0-9.]+)?/containers/[^/]+/json$`)
)

func newStalePauseDaemon(t *testing.T, from, to int) *stalePauseDaemon {
	t.Helper()
	dockertest.Require(t)
	real := dockertest.NewProxy(t) // the daemon's socket, found as the tests find it
	s := &stalePauseDaemon{from: from, to: to, seen: -1}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(&url.URL{Scheme: "http", Host: "docker"}) },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", real.Addr())
		}},
		ModifyResponse: s.modify,
	}
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && unpausePath.MatchString(r.URL.Path) {
			rw := &statusWriter{ResponseWriter: w}
			rp.ServeHTTP(rw, r)
			if rw.code/100 == 2 {
				s.mu.Lock()
				s.seen = 0
				s.mu.Unlock()
			}
			return
		}
		rp.ServeHTTP(w, r)
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	s.host = "unix://" + sock
	return s
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) { w.code = code; w.ResponseWriter.WriteHeader(code) }

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (s *stalePauseDaemon) modify(resp *http.Response) error {
	if resp.Request.Method != http.MethodGet || !inspectPath.MatchString(resp.Request.URL.Path) || resp.StatusCode != http.StatusOK {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen < 0 {
		return nil
	}
	s.seen++
	if s.seen < s.from || s.seen > s.to {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		return err
	}
	if st, ok := doc["State"].(map[string]any); ok {
		st["Paused"], st["Status"] = true, "paused"
		s.served++
	}
	if body, err = json.Marshal(doc); err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return nil
}

func (s *stalePauseDaemon) staleServed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served
}

// pauseResume makes a sandbox through a stalePauseDaemon of stale answers
// from to to, pauses it and resumes it at once, with afterLast as the
// provider's settleAfterLast (0: the default); it returns the daemon, the
// provider, the sandbox and a context for the rest of the test.
func pauseResume(t *testing.T, from, to int, afterLast time.Duration) (*stalePauseDaemon, *Docker, string, context.Context) {
	t.Helper()
	daemon := newStalePauseDaemon(t, from, to)
	p := newProvider(t, func(o *Options) { o.Host = daemon.host })
	if afterLast > 0 {
		p.afterLast = afterLast
	}
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxFor(t, time.Minute)
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	return daemon, p, id, ctx
}

// A sandbox just resumed is running, whatever a late event of its pause
// makes the daemon report for a moment; and a stale "paused" never makes
// the gateway refuse work on a running sandbox.
func TestResumeOutlivesLatePauseEvent(t *testing.T) {
	t.Parallel()
	const stale = 3
	daemon, p, id, ctx := pauseResume(t, 1, stale, 0)
	if st, err := p.Status(ctx, id); err != nil || st != providers.StateRunning {
		t.Errorf("Status right after Resume: %q %v, want running", st, err)
	}
	if n := daemon.staleServed(); n != stale {
		t.Errorf("the proxy gave %d stale answers, want %d (the test did not test the race)", n, stale)
	}
	if r := run(t, p, id, "echo ok"); string(r.Stdout) != "ok\n" {
		t.Errorf("exec after Resume: %q", r.Stdout)
	}

	// A Status that read a stale "paused" marks the sandbox so; the next
	// exec asks the daemon before refusing.
	p.setPaused(id, true)
	if r := run(t, p, id, "echo again"); string(r.Stdout) != "again\n" {
		t.Errorf("exec with a stale paused mark: %q", r.Stdout)
	}
}

// A pause's event can come later still, after the daemon has reported the
// resumed sandbox running for a while (settleHold): a Resume right after
// a Pause waits out settleAfterLast, so no Status after it sees "paused".
// Here the stale answers are the 8th to the 12th inspection after the
// unpause: Resume would have returned after about 6 (50 ms of polls).
// The proxy counts inspections, not time, so settleAfterLast is 3 s here:
// a Pause and an unpause that took over 500 ms on a loaded machine would
// have let Resume return after its 50 ms hold, before the 8th (the product
// times the late event from the Pause; the test cannot).
func TestResumeOutlivesLaterPauseEvent(t *testing.T) {
	t.Parallel()
	const from, to = 8, 12
	daemon, p, id, ctx := pauseResume(t, from, to, 3*time.Second)
	for i := range to {
		if st, err := p.Status(ctx, id); err != nil || st != providers.StateRunning {
			t.Fatalf("Status %d after Resume: %q %v, want running", i+1, st, err)
		}
	}
	if n := daemon.staleServed(); n != to-from+1 {
		t.Errorf("the proxy gave %d stale answers, want %d (the test did not test the race)", n, to-from+1)
	}
}
