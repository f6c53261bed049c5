// Package providertest is the conformance suite every sandbox provider
// must pass: Run drives a providers.Provider through the behaviour the
// service and the API promise (exec semantics, timeouts, background
// processes, files, lifecycle, isolation, and the terminal processes of
// providers that start them). A provider's own tests call Run
// with a real backend; nothing here is faked.
package providertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// Deadlines: generous enough for a loaded CI machine and a slow backend,
// bounded so that a hang fails the test instead of stalling it.
const (
	opTimeout   = 60 * time.Second // one provider call
	pollTimeout = 20 * time.Second // a condition that should become true soon
	readyWait   = 60 * time.Second
)

// Run runs the suite against p. base carries what p needs to create a
// sandbox (Image, Resources, ...); the suite sets ID, Workdir, Env and
// ReadyTimeout itself. Every sandbox the suite creates is deleted when the
// test ends, also on failure.
func Run(t *testing.T, p providers.Provider, base providers.CreateSpec) {
	s := &suite{p: p, base: base}
	a := s.create(t, "/workspace", map[string]string{"SANDBOX_VAR": "from-sandbox", "OVERRIDE_ME": "sandbox"})
	b := s.create(t, "/srv/providertest/deep/work", nil)

	t.Run("Exec", func(t *testing.T) {
		t.Run("StdoutStderr", func(t *testing.T) { s.testStdoutStderr(t, a) })
		t.Run("ExitCodes", func(t *testing.T) { s.testExitCodes(t, a) })
		t.Run("Shell", func(t *testing.T) { s.testShell(t, a) })
		t.Run("Env", func(t *testing.T) { s.testEnv(t, a) })
		t.Run("Cwd", func(t *testing.T) { s.testCwd(t, a, b) })
		t.Run("User", func(t *testing.T) { s.testUser(t, a) })
		t.Run("Stdin", func(t *testing.T) { s.testStdin(t, a) })
		t.Run("OutputCap", func(t *testing.T) { s.testOutputCap(t, a) })
		t.Run("Timeout", func(t *testing.T) { s.testTimeout(t, a) })
		t.Run("ContextCancel", func(t *testing.T) { s.testCancel(t, a) })
		t.Run("BackgroundKilled", func(t *testing.T) { s.testBackgroundKilled(t, a) })
		t.Run("BackgroundPreserved", func(t *testing.T) { s.testBackgroundPreserved(t, a) })
		t.Run("Concurrent", func(t *testing.T) { s.testConcurrent(t, a) })
	})
	t.Run("Files", func(t *testing.T) {
		t.Run("RoundTrip", func(t *testing.T) { s.testFileRoundTrip(t, a) })
		t.Run("Overwrite", func(t *testing.T) { s.testFileOverwrite(t, a) })
		t.Run("ParentDirs", func(t *testing.T) { s.testFileParents(t, a) })
		t.Run("SharedWithExec", func(t *testing.T) { s.testFileExec(t, a) })
		t.Run("Errors", func(t *testing.T) { s.testFileErrors(t, a) })
		t.Run("SymlinksStayInside", func(t *testing.T) { s.testSymlinks(t, a) })
		if fl, ok := p.(providers.FileLister); ok {
			t.Run("InfoAndList", func(t *testing.T) { s.testFileInfo(t, fl, a) })
		}
	})
	t.Run("Isolation", func(t *testing.T) {
		t.Run("Processes", func(t *testing.T) { s.testProcessIsolation(t, a, b) })
		t.Run("Loopback", func(t *testing.T) { s.testLoopback(t, a, b) })
	})
	if mr, ok := p.(providers.MetricsReader); ok {
		t.Run("Metrics", func(t *testing.T) { s.testMetrics(t, mr, a) })
	}
	t.Run("Status", func(t *testing.T) { s.testStatus(t, a) })
	t.Run("List", func(t *testing.T) { s.testList(t, a, b) })
	t.Run("CreateErrors", func(t *testing.T) { s.testCreateErrors(t, a) })
	if _, ok := p.(providers.Pauser); ok {
		t.Run("PauseResume", func(t *testing.T) { s.testPause(t, b) })
	}
	t.Run("Delete", func(t *testing.T) { s.testDelete(t, b) })
}

type suite struct {
	p    providers.Provider
	base providers.CreateSpec
}

// NewID is testkit.NewID: a fresh sandbox id in the service's format.
func NewID() string { return testkit.NewID() }

// IDPrefix is testkit.IDPrefix: it starts every id NewID makes in this
// process.
var IDPrefix = testkit.IDPrefix

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox that is deleted when t ends.
func (s *suite) create(t *testing.T, workdir string, env map[string]string) string {
	t.Helper()
	spec := s.base
	spec.ID = NewID()
	spec.Workdir = workdir
	spec.Env = env
	spec.ReadyTimeout = readyWait
	sb, err := s.p.Create(ctxT(t, opTimeout), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sb.ID != spec.ID || sb.Workdir != workdir {
		t.Errorf("Create returned id %q workdir %q, want %q %q", sb.ID, sb.Workdir, spec.ID, workdir)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := s.p.Delete(ctx, spec.ID); err != nil && !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Delete %s at cleanup: %v", spec.ID, err)
		}
	})
	return spec.ID
}

// run executes req and fails the test on an error.
func (s *suite) run(t *testing.T, id string, req providers.ExecRequest) providers.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = opTimeout
	}
	if req.MaxOutput == 0 {
		req.MaxOutput = 1 << 20
	}
	res, err := s.p.Exec(ctxT(t, opTimeout+req.Timeout), id, req)
	if err != nil {
		t.Fatalf("Exec %q: %v", req.Command, err)
	}
	return res
}

// sh runs cmd, requires exit 0 and returns stdout.
func (s *suite) sh(t *testing.T, id, cmd string) string {
	t.Helper()
	res := s.run(t, id, providers.ExecRequest{Command: cmd})
	if res.ExitCode != 0 {
		t.Fatalf("%q exited %d; stdout %q stderr %q", cmd, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// eventually polls cond until it holds or pollTimeout passes; cond's
// string says what it saw last.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testkit.EventuallyNil(t, what, pollTimeout, func() error {
		if ok, last := cond(); !ok {
			return errors.New(last)
		}
		return nil
	})
}

// marker is a sleep argument unique to one test, so its processes can be
// counted from inside the sandbox with nothing but sh and /proc. The
// counting command spells it in two halves, so it never counts itself.
type marker struct{ a, b string }

func newMarker() marker {
	n := make([]byte, 2)
	rand.Read(n)
	return marker{a: strconv.Itoa(4000 + int(n[0])*30 + int(n[1])%30), b: ".17"}
}

// sleep is a command that sleeps long, recognisably.
func (m marker) sleep() string { return "sleep " + m.a + m.b }

// each is a loop over the marker's live sleep processes (comm "sleep", so
// the shell that started them does not count), running body with $d set
// to the process's /proc directory.
func (m marker) each(body string) string {
	return `a=` + m.a + `; b=` + m.b + `; for d in /proc/[0-9]*; do c=; read -r c 2>/dev/null < $d/comm; ` +
		`if [ "$c" = sleep ] && grep -aq "$a$b" $d/cmdline 2>/dev/null; then ` + body + `; fi; done`
}

// count is a command printing how many live processes carry the marker.
func (m marker) count() string { return "n=0; " + m.each("n=$((n+1))") + "; echo $n" }

// kill is a command that SIGKILLs the marker's processes.
func (m marker) kill() string { return m.each("kill -9 ${d#/proc/} 2>/dev/null") + "; true" }

func (s *suite) markerCount(t *testing.T, id string, m marker) int {
	t.Helper()
	out := strings.TrimSpace(s.sh(t, id, m.count()))
	n, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("marker count: %q", out)
	}
	return n
}

func (s *suite) waitMarker(t *testing.T, id string, m marker, want int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d process(es) of %q", want, m.sleep()), func() (bool, string) {
		n := s.markerCount(t, id, m)
		return n == want, strconv.Itoa(n)
	})
}

func (s *suite) testStdoutStderr(t *testing.T, id string) {
	res := s.run(t, id, providers.ExecRequest{Command: "echo out; echo err >&2; printf 'no newline'"})
	if string(res.Stdout) != "out\nno newline" || string(res.Stderr) != "err\n" || res.ExitCode != 0 {
		t.Errorf("got stdout %q stderr %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
	}
	if res.TimedOut || res.Truncated {
		t.Errorf("TimedOut %v Truncated %v, want false", res.TimedOut, res.Truncated)
	}
	if res.Duration <= 0 {
		t.Errorf("Duration %v", res.Duration)
	}
	res = s.run(t, id, providers.ExecRequest{Command: "true"})
	if len(res.Stdout) != 0 || len(res.Stderr) != 0 {
		t.Errorf("true printed %q %q", res.Stdout, res.Stderr)
	}
}

func (s *suite) testExitCodes(t *testing.T, id string) {
	for _, c := range []struct {
		cmd  string
		want int
	}{
		{"exit 0", 0}, {"exit 1", 1}, {"exit 3", 3}, {"exit 255", 255},
		{"false", 1}, {"no-such-command-sandgate", 127},
		{"kill -TERM $$", 128 + 15}, {"kill -KILL $$", 128 + 9}, {"kill -INT $$", 128 + 2},
	} {
		res := s.run(t, id, providers.ExecRequest{Command: c.cmd})
		if res.ExitCode != c.want || res.TimedOut {
			t.Errorf("%q: exit %d timedOut %v, want %d", c.cmd, res.ExitCode, res.TimedOut, c.want)
		}
	}
}

func (s *suite) testShell(t *testing.T, id string) {
	// bash when the sandbox has it, sh otherwise.
	s.sh(t, id, `[ -n "$BASH_VERSION" ] || [ ! -x /bin/bash ]`)
	// A multi-line script with quotes runs as written.
	out := s.sh(t, id, "x='a b'\nfor w in $x; do\n  echo \"[$w]\"\ndone")
	if out != "[a]\n[b]\n" {
		t.Errorf("script output %q", out)
	}
	// A long script (agent harnesses send whole files as commands).
	long := ": '" + strings.Repeat("x", 100_000) + "'; echo long-ok"
	if out := s.sh(t, id, long); out != "long-ok\n" {
		t.Errorf("100 kB command: %q", out)
	}
}

func (s *suite) testEnv(t *testing.T, id string) {
	res := s.run(t, id, providers.ExecRequest{
		Command: `echo "$SANDBOX_VAR|$REQ_VAR|$OVERRIDE_ME|$SPACED"`,
		Env:     map[string]string{"REQ_VAR": "from-request", "OVERRIDE_ME": "request", "SPACED": "a b  c"},
	})
	if got := string(res.Stdout); got != "from-sandbox|from-request|request|a b  c\n" {
		t.Errorf("env: %q", got)
	}
	out := s.sh(t, id, `echo "$PATH"; echo "$HOME"`)
	lines := strings.Split(out, "\n")
	if len(lines) < 2 || !strings.Contains(lines[0], "/bin") || lines[1] == "" {
		t.Errorf("PATH/HOME: %q", out)
	}
}

func (s *suite) testCwd(t *testing.T, a, b string) {
	if got := s.sh(t, a, "pwd"); got != "/workspace\n" {
		t.Errorf("default cwd %q, want the workdir", got)
	}
	res := s.run(t, a, providers.ExecRequest{Command: "pwd", Cwd: "/tmp"})
	if string(res.Stdout) != "/tmp\n" {
		t.Errorf("cwd /tmp: %q", res.Stdout)
	}
	// A workdir that did not exist was created, and is writable.
	if got := s.sh(t, b, "pwd; touch x && ls x"); got != "/srv/providertest/deep/work\nx\n" {
		t.Errorf("created workdir: %q", got)
	}
	_, err := s.p.Exec(ctxT(t, opTimeout), a, providers.ExecRequest{Command: "pwd", Cwd: "/no/such/dir", Timeout: opTimeout, MaxOutput: 1024})
	if err == nil {
		t.Errorf("exec in a missing cwd succeeded")
	}
}

func (s *suite) testUser(t *testing.T, id string) {
	if got := s.sh(t, id, "id -u"); got != "0\n" {
		t.Errorf("default user uid %q, want 0", got)
	}
	for _, u := range []string{"nobody", "65534"} {
		res := s.run(t, id, providers.ExecRequest{Command: "id -u; id -un; touch /tmp/by-$(id -u) && stat -c %u /tmp/by-$(id -u)", User: u})
		if got := string(res.Stdout); got != "65534\nnobody\n65534\n" || res.ExitCode != 0 {
			t.Errorf("user %s: %q %q exit %d", u, got, res.Stderr, res.ExitCode)
		}
	}
	// Root's files stay out of reach of nobody.
	s.sh(t, id, "echo secret > /tmp/root-only && chmod 600 /tmp/root-only")
	res := s.run(t, id, providers.ExecRequest{Command: "cat /tmp/root-only", User: "nobody"})
	if res.ExitCode == 0 {
		t.Errorf("nobody read a 0600 root file: %q", res.Stdout)
	}
	_, err := s.p.Exec(ctxT(t, opTimeout), id, providers.ExecRequest{Command: "true", User: "no-such-user-sandgate", Timeout: opTimeout, MaxOutput: 1024})
	if !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("unknown user: %v, want ErrInvalid", err)
	}
}

func (s *suite) testStdin(t *testing.T, id string) {
	res := s.run(t, id, providers.ExecRequest{Command: "cat", Stdin: []byte("hello\nworld")})
	if string(res.Stdout) != "hello\nworld" {
		t.Errorf("cat stdin: %q", res.Stdout)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB: more than a pipe buffer
	res = s.run(t, id, providers.ExecRequest{Command: "wc -c", Stdin: big})
	if strings.TrimSpace(string(res.Stdout)) != strconv.Itoa(len(big)) {
		t.Errorf("wc -c of 1 MiB stdin: %q", res.Stdout)
	}
	// A command that ignores its stdin still finishes.
	res = s.run(t, id, providers.ExecRequest{Command: "echo ignored", Stdin: big})
	if string(res.Stdout) != "ignored\n" {
		t.Errorf("ignored stdin: %q", res.Stdout)
	}
	// nil stdin is /dev/null: cat sees EOF at once.
	res = s.run(t, id, providers.ExecRequest{Command: "cat; echo eof", Timeout: 20 * time.Second})
	if string(res.Stdout) != "eof\n" || res.TimedOut {
		t.Errorf("nil stdin: %q timedOut %v", res.Stdout, res.TimedOut)
	}
}

func (s *suite) testOutputCap(t *testing.T, id string) {
	res := s.run(t, id, providers.ExecRequest{Command: "head -c 100000 /dev/zero", MaxOutput: 1000})
	if len(res.Stdout) != 1000 || !res.Truncated || res.ExitCode != 0 {
		t.Errorf("capped stdout: %d bytes truncated %v exit %d", len(res.Stdout), res.Truncated, res.ExitCode)
	}
	// Far past the cap, on both streams: the command must not block on a
	// full pipe.
	res = s.run(t, id, providers.ExecRequest{
		Command:   "head -c 20000000 /dev/zero; head -c 20000000 /dev/zero >&2; echo done",
		MaxOutput: 4096,
	})
	if len(res.Stdout) != 4096 || len(res.Stderr) != 4096 || !res.Truncated || res.ExitCode != 0 || res.TimedOut {
		t.Errorf("20 MB per stream: %d/%d bytes truncated %v exit %d", len(res.Stdout), len(res.Stderr), res.Truncated, res.ExitCode)
	}
	res = s.run(t, id, providers.ExecRequest{Command: "head -c 1000 /dev/zero", MaxOutput: 1000})
	if len(res.Stdout) != 1000 || res.Truncated {
		t.Errorf("exactly the cap: %d bytes truncated %v", len(res.Stdout), res.Truncated)
	}
}

func (s *suite) testTimeout(t *testing.T, id string) {
	m := newMarker()
	start := time.Now()
	res := s.run(t, id, providers.ExecRequest{
		Command: "echo started; echo err-started >&2; " + m.sleep() + " & " + m.sleep() + "; echo never",
		Timeout: time.Second,
	})
	if !res.TimedOut || res.ExitCode != 125 {
		t.Errorf("TimedOut %v exit %d, want true 125", res.TimedOut, res.ExitCode)
	}
	if string(res.Stdout) != "started\n" || string(res.Stderr) != "err-started\n" {
		t.Errorf("output so far: %q %q", res.Stdout, res.Stderr)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("timeout of 1s took %v", el)
	}
	// The whole process group is gone, the background sleep too.
	s.waitMarker(t, id, m, 0)
}

func (s *suite) testCancel(t *testing.T, id string) {
	m := newMarker()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		res providers.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := s.p.Exec(ctx, id, providers.ExecRequest{
			Command: m.sleep() + " & " + m.sleep(), Timeout: 5 * time.Minute, MaxOutput: 1024,
		})
		done <- result{res, err}
	}()
	s.waitMarker(t, id, m, 2)
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("Exec after cancel: %v, want context.Canceled", r.err)
		}
	case <-time.After(pollTimeout):
		t.Fatal("Exec did not return after its context was cancelled")
	}
	s.waitMarker(t, id, m, 0)
}

func (s *suite) testBackgroundKilled(t *testing.T, id string) {
	m := newMarker()
	start := time.Now()
	// The leftover holds stdout open: returning must not wait for it.
	res := s.run(t, id, providers.ExecRequest{Command: m.sleep() + " & echo bg-started"})
	if res.ExitCode != 0 || string(res.Stdout) != "bg-started\n" {
		t.Errorf("exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("exec with a leftover took %v", el)
	}
	s.waitMarker(t, id, m, 0)

	// Also a leftover that redirected its output and runs in a subshell.
	s.run(t, id, providers.ExecRequest{Command: "(" + m.sleep() + " >/dev/null 2>&1 &) ; true"})
	s.waitMarker(t, id, m, 0)
}

func (s *suite) testBackgroundPreserved(t *testing.T, id string) {
	m := newMarker()
	t.Cleanup(func() { s.run(t, id, providers.ExecRequest{Command: m.kill()}) })
	start := time.Now()
	res := s.run(t, id, providers.ExecRequest{Command: m.sleep() + " & echo bg-started", PreserveBackground: true})
	if res.ExitCode != 0 || string(res.Stdout) != "bg-started\n" {
		t.Errorf("exit %d stdout %q", res.ExitCode, res.Stdout)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("exec with a preserved leftover took %v (waited for it?)", el)
	}
	if n := s.markerCount(t, id, m); n != 1 {
		t.Errorf("preserved sleep: %d processes, want 1", n)
	}
	// Later execs (which kill their own leftovers) leave it alone.
	s.sh(t, id, "true")
	if n := s.markerCount(t, id, m); n != 1 {
		t.Errorf("preserved sleep after another exec: %d processes, want 1", n)
	}
}

func (s *suite) testConcurrent(t *testing.T, id string) {
	const n = 20
	var wg sync.WaitGroup
	errs := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.p.Exec(ctxT(t, opTimeout), id, providers.ExecRequest{
				Command: fmt.Sprintf("echo %d; sleep 0.2; echo %d >&2; exit %d", i, i*2, i%7),
				Timeout: opTimeout, MaxOutput: 1024,
			})
			switch {
			case err != nil:
				errs[i] = err.Error()
			case string(res.Stdout) != fmt.Sprintf("%d\n", i) || string(res.Stderr) != fmt.Sprintf("%d\n", i*2) || res.ExitCode != i%7:
				errs[i] = fmt.Sprintf("got %q %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
			}
		}()
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("exec %d: %s", i, e)
		}
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func (s *suite) write(t *testing.T, id, path string, data []byte) {
	t.Helper()
	n, err := s.p.WriteFile(ctxT(t, opTimeout), id, path, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("WriteFile %s: %v", path, err)
	}
	if n != int64(len(data)) {
		t.Errorf("WriteFile %s wrote %d bytes, want %d", path, n, len(data))
	}
}

func (s *suite) read(t *testing.T, id, path string) ([]byte, error) {
	t.Helper()
	rc, size, err := s.p.ReadFile(ctxT(t, opTimeout), id, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	if size != int64(len(b)) {
		t.Errorf("ReadFile %s: size %d, read %d bytes", path, size, len(b))
	}
	return b, nil
}

func (s *suite) testFileRoundTrip(t *testing.T, id string) {
	for _, n := range []int{0, 1, 5 << 20} {
		data := randomBytes(n)
		p := fmt.Sprintf("/workspace/rt-%d.bin", n)
		s.write(t, id, p, data)
		got, err := s.read(t, id, p)
		if err != nil {
			t.Fatalf("ReadFile %s: %v", p, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%d bytes: round trip differs (got %d bytes)", n, len(got))
		}
		if out := s.sh(t, id, "wc -c < "+p); strings.TrimSpace(out) != strconv.Itoa(n) {
			t.Errorf("%d bytes: the sandbox sees %q bytes", n, out)
		}
	}
}

func (s *suite) testFileOverwrite(t *testing.T, id string) {
	s.write(t, id, "/workspace/ow.txt", []byte("a much longer first version"))
	s.write(t, id, "/workspace/ow.txt", []byte("short"))
	got, err := s.read(t, id, "/workspace/ow.txt")
	if err != nil || string(got) != "short" {
		t.Errorf("overwritten file: %q %v", got, err)
	}
}

func (s *suite) testFileParents(t *testing.T, id string) {
	s.write(t, id, "/workspace/p1/p2/p3/f.txt", []byte("deep"))
	if out := s.sh(t, id, "cat /workspace/p1/p2/p3/f.txt; stat -c %u /workspace/p1/p2/p3 /workspace/p1/p2/p3/f.txt"); out != "deep0\n0\n" {
		t.Errorf("parents: %q", out)
	}
	// Outside the workdir too.
	s.write(t, id, "/srv/providertest/f.txt", []byte("srv"))
	if out := s.sh(t, id, "cat /srv/providertest/f.txt"); out != "srv" {
		t.Errorf("outside the workdir: %q", out)
	}
}

func (s *suite) testFileExec(t *testing.T, id string) {
	s.sh(t, id, "printf 'made by exec' > /workspace/from-exec.txt")
	got, err := s.read(t, id, "/workspace/from-exec.txt")
	if err != nil || string(got) != "made by exec" {
		t.Errorf("file made by exec: %q %v", got, err)
	}
	s.write(t, id, "/tmp/from-api.txt", []byte("made by api"))
	if out := s.sh(t, id, "cat /tmp/from-api.txt"); out != "made by api" {
		t.Errorf("file made by the API in /tmp: %q", out)
	}
}

func (s *suite) testFileErrors(t *testing.T, id string) {
	ctx := ctxT(t, opTimeout)
	if _, _, err := s.p.ReadFile(ctx, id, "/workspace/no-such-file"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("missing file: %v, want ErrNotFound", err)
	}
	if _, _, err := s.p.ReadFile(ctx, id, "/no/such/dir/file"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("missing dir: %v, want ErrNotFound", err)
	}
	if _, _, err := s.p.ReadFile(ctx, id, "/workspace"); !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("directory: %v, want ErrInvalid", err)
	}
	if _, err := s.p.WriteFile(ctx, id, "/workspace", strings.NewReader("x")); !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("write over a directory: %v, want ErrInvalid", err)
	}
	if _, _, err := s.p.ReadFile(ctx, "sbx-aaaaaaaaaaaaaaaaaaaa", "/etc/hostname"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("unknown sandbox: %v, want ErrNotFound", err)
	}
	for _, err := range []error{errOf(s.p.ReadFile(ctx, id, "/workspace/../../../../etc/passwd")), errOfW(s.p.WriteFile(ctx, id, "/../x", strings.NewReader("x")))} {
		if err != nil && !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("path with ..: %v, want success inside the sandbox or ErrInvalid", err)
		}
	}
}

func errOf(_ io.ReadCloser, _ int64, err error) error {
	return err
}

func errOfW(_ int64, err error) error { return err }

// testSymlinks checks that a symlink made inside the sandbox resolves
// inside it: never to the host's file of the same path.
func (s *suite) testSymlinks(t *testing.T, id string) {
	hostDir := t.TempDir()
	hostFile := filepath.Join(hostDir, "secret")
	if err := os.WriteFile(hostFile, []byte("HOST-SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(hostDir, "only-on-host")
	if err := os.WriteFile(missing, []byte("HOST-ONLY"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Inside, the same path holds different bytes; "only-on-host" does not
	// exist inside at all.
	s.sh(t, id, fmt.Sprintf("mkdir -p %[1]s && printf INSIDE > %[2]s && rm -f %[3]s && "+
		"ln -sf %[2]s /workspace/abs-link && ln -sf %[3]s /workspace/missing-link && "+
		"ln -sf ../../../../../../../..%[2]s /workspace/rel-link && ln -sfn %[1]s /workspace/dir-link",
		hostDir, hostFile, missing))

	for _, p := range []string{"/workspace/abs-link", "/workspace/rel-link", "/workspace/dir-link/secret"} {
		got, err := s.read(t, id, p)
		if err != nil || string(got) != "INSIDE" {
			t.Errorf("read %s: %q %v, want the sandbox's file", p, got, err)
		}
	}
	got, err := s.read(t, id, "/workspace/missing-link")
	if err == nil || bytes.Contains(got, []byte("HOST")) {
		t.Errorf("read through a link to a host-only file: %q %v, want an error", got, err)
	}
	// Writes through links land inside too.
	s.write(t, id, "/workspace/dir-link/secret", []byte("WRITTEN"))
	s.write(t, id, "/workspace/missing-link", []byte("WRITTEN"))
	for _, f := range []string{hostFile, missing} {
		b, err := os.ReadFile(f)
		if err != nil || strings.Contains(string(b), "WRITTEN") {
			t.Errorf("host file %s changed through a sandbox link: %q %v", f, b, err)
		}
	}
	if out := s.sh(t, id, "cat "+hostFile+"; echo; cat "+missing); out != "WRITTEN\nWRITTEN" {
		t.Errorf("writes through links, seen inside: %q", out)
	}
}

func (s *suite) testProcessIsolation(t *testing.T, a, b string) {
	m := newMarker()
	t.Cleanup(func() { s.run(t, b, providers.ExecRequest{Command: m.kill()}) })
	s.run(t, b, providers.ExecRequest{Command: m.sleep() + " >/dev/null 2>&1 &", PreserveBackground: true})
	s.waitMarker(t, b, m, 1)
	if n := s.markerCount(t, a, m); n != 0 {
		t.Errorf("sandbox a sees %d processes of sandbox b", n)
	}
	// The host's processes are not visible either: a sandbox holds few.
	out := s.sh(t, a, "ls -d /proc/[0-9]* | wc -l")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n == 0 || n > 30 {
		t.Errorf("sandbox sees %d processes", n)
	}
}

// server returns commands for a loopback TCP server on port that answers
// every connection with a line, and for a client that prints that line;
// ok is false when the sandbox has neither python3, perl nor busybox's
// httpd and wget.
func (s *suite) server(t *testing.T, id string, port int) (srv, cli string, ok bool) {
	have := s.run(t, id, providers.ExecRequest{Command: "command -v python3 || command -v perl || (command -v httpd >/dev/null && command -v wget)"})
	tool := strings.TrimSpace(string(have.Stdout))
	switch {
	case strings.HasSuffix(tool, "wget"):
		// busybox: httpd serves a file whose directory names the marker the
		// cleanup looks for in /proc/*/cmdline.
		srv = fmt.Sprintf(`mkdir -p /tmp/sandgate-pong && echo sandgate-pong > /tmp/sandgate-pong/p && httpd -f -p 127.0.0.1:%d -h /tmp/sandgate-pong`, port)
		cli = fmt.Sprintf(`wget -q -O - http://127.0.0.1:%d/p`, port) // no -T: it crashes busybox 1.35's static wget
	case strings.HasSuffix(tool, "python3"):
		srv = fmt.Sprintf(`python3 -c 'import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", %d)); s.listen(8)
while True:
    c, _ = s.accept(); c.sendall(b"sandgate-pong\n"); c.close()'`, port)
		cli = fmt.Sprintf(`python3 -c 'import socket
c = socket.create_connection(("127.0.0.1", %d), 2); print(c.recv(100).decode().strip())'`, port)
	case strings.HasSuffix(tool, "perl"):
		srv = fmt.Sprintf(`perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => %d, Listen => 8, ReuseAddr => 1) or die "$!"; while ($c = $s->accept) { print $c "sandgate-pong\n"; close $c }'`, port)
		cli = fmt.Sprintf(`perl -MIO::Socket::INET -e '$c = IO::Socket::INET->new(PeerAddr => "127.0.0.1", PeerPort => %d, Timeout => 2) or die "$!"; print scalar <$c>'`, port)
	default:
		return "", "", false
	}
	return srv + " >/dev/null 2>&1 &", cli, true
}

func (s *suite) testLoopback(t *testing.T, a, b string) {
	port := 20000 + int(randomBytes(1)[0])*40
	srv, cli, ok := s.server(t, a, port)
	if !ok {
		t.Fatal("the sandbox image has neither python3, perl nor busybox httpd+wget for a loopback server")
	}
	t.Cleanup(func() {
		// The pattern is split so that this shell does not match itself.
		s.run(t, a, providers.ExecRequest{Command: `a=sandgate-; b=pong; for d in /proc/[0-9]*; do if grep -aq "$a$b" $d/cmdline 2>/dev/null; then kill -9 ${d#/proc/}; fi; done; true`})
	})
	s.run(t, a, providers.ExecRequest{Command: srv, PreserveBackground: true})
	eventually(t, "the loopback server to answer from the next exec", func() (bool, string) {
		res := s.run(t, a, providers.ExecRequest{Command: cli, Timeout: 10 * time.Second})
		return strings.TrimSpace(string(res.Stdout)) == "sandgate-pong", string(res.Stdout) + string(res.Stderr)
	})
	// Another sandbox's loopback is its own.
	res := s.run(t, b, providers.ExecRequest{Command: cli, Timeout: 10 * time.Second})
	if strings.Contains(string(res.Stdout), "sandgate-pong") {
		t.Errorf("sandbox b reached sandbox a's loopback server")
	}
}

func (s *suite) testStatus(t *testing.T, id string) {
	st, err := s.p.Status(ctxT(t, opTimeout), id)
	if err != nil || st != providers.StateRunning {
		t.Errorf("Status: %q %v, want running", st, err)
	}
	if _, err := s.p.Status(ctxT(t, opTimeout), "sbx-aaaaaaaaaaaaaaaaaaaa"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Status of an unknown sandbox: %v, want ErrNotFound", err)
	}
}

func (s *suite) testList(t *testing.T, ids ...string) {
	owned, err := s.p.List(ctxT(t, opTimeout))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, id := range ids {
		i := slices.IndexFunc(owned, func(o providers.Owned) bool { return o.ID == id })
		if i < 0 {
			t.Errorf("List lacks %s", id)
		} else if owned[i].State != providers.StateRunning {
			t.Errorf("List: %s is %q, want running", id, owned[i].State)
		}
	}
}

func (s *suite) testCreateErrors(t *testing.T, existing string) {
	spec := s.base
	spec.ID = NewID()
	spec.Workdir = "/workspace"
	spec.ReadyTimeout = readyWait
	spec.Options = map[string]any{"no_such_option_sandgate": true}
	_, err := s.p.Create(ctxT(t, opTimeout), spec)
	if !errors.Is(err, providers.ErrInvalid) || !strings.Contains(providers.Message(err), "no_such_option_sandgate") {
		t.Errorf("unknown option: %v, want ErrInvalid naming the key", err)
	}
	if st, err := s.p.Status(ctxT(t, opTimeout), spec.ID); err == nil {
		t.Errorf("a refused create left sandbox %s behind (%s)", spec.ID, st)
	}
	spec.Options = nil
	spec.ID = existing
	if _, err := s.p.Create(ctxT(t, opTimeout), spec); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("create of an existing id: %v, want ErrConflict", err)
	}
	s.sh(t, existing, "true")
}

func (s *suite) testPause(t *testing.T, id string) {
	pr := s.p.(providers.Pauser)
	ctx := ctxT(t, opTimeout)
	m := newMarker()
	s.run(t, id, providers.ExecRequest{Command: m.sleep() + " >/dev/null 2>&1 &", PreserveBackground: true})
	if err := pr.Resume(ctx, id); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Resume of a running sandbox: %v, want ErrConflict", err)
	}
	if err := pr.Pause(ctx, id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, err := s.p.Status(ctx, id); err != nil || st != providers.StatePaused {
		t.Errorf("Status after Pause: %q %v", st, err)
	}
	if err := pr.Pause(ctx, id); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Pause of a paused sandbox: %v, want ErrConflict", err)
	}
	start := time.Now()
	_, err := s.p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 1024})
	if !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Exec while paused: %v, want ErrConflict", err)
	}
	if _, err := s.p.WriteFile(ctx, id, "/tmp/paused", strings.NewReader("x")); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("WriteFile while paused: %v, want ErrConflict", err)
	}
	if _, _, err := s.p.ReadFile(ctx, id, "/etc/hostname"); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("ReadFile while paused: %v, want ErrConflict", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("refusing work on a paused sandbox took %v", el)
	}
	if err := pr.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if st, err := s.p.Status(ctx, id); err != nil || st != providers.StateRunning {
		t.Errorf("Status after Resume: %q %v", st, err)
	}
	// What ran before the pause runs on.
	if n := s.markerCount(t, id, m); n != 1 {
		t.Errorf("after resume %d processes of the earlier sleep, want 1", n)
	}
	s.sh(t, id, m.kill())
}

func (s *suite) testDelete(t *testing.T, id string) {
	ctx := ctxT(t, opTimeout)
	if err := s.p.Delete(ctx, id); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := s.p.Status(ctx, id); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Status after Delete: %v, want ErrNotFound", err)
	}
	if _, err := s.p.Exec(ctx, id, providers.ExecRequest{Command: "true", Timeout: time.Minute, MaxOutput: 1024}); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Exec after Delete: %v, want ErrNotFound", err)
	}
	if _, _, err := s.p.ReadFile(ctx, id, "/etc/hostname"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("ReadFile after Delete: %v, want ErrNotFound", err)
	}
	if err := s.p.Delete(ctx, id); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
	owned, err := s.p.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if slices.ContainsFunc(owned, func(o providers.Owned) bool { return o.ID == id }) {
		t.Errorf("List still has deleted %s", id)
	}
}
