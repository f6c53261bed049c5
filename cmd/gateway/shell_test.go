package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/testkit"
)

// newSandbox creates a sandbox through the REST API and returns its id
// and owner lease.
func newSandbox(t *testing.T, base string) (id, lease string) {
	t.Helper()
	code, body := call(t, "POST", base+"/v1/sandboxes", `{"ttl_s": 600}`)
	if code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	var ref struct {
		SandboxID  string `json:"sandbox_id"`
		LeaseToken string `json:"lease_token"`
	}
	if err := json.Unmarshal(body, &ref); err != nil {
		t.Fatal(err)
	}
	return ref.SandboxID, ref.LeaseToken
}

// watched is the output of a process, which a test can wait on.
type watched struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // gets a token after every write
}

func newWatched() *watched { return &watched{changed: make(chan struct{}, 1)} }

func (w *watched) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	select {
	case w.changed <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (w *watched) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// waitFor waits until the output matches re and returns the match.
func (w *watched) waitFor(t *testing.T, re string, timeout time.Duration) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if m := rx.FindStringSubmatch(w.String()); m != nil {
			return m
		}
		select {
		case <-w.changed:
		case <-deadline.C:
			t.Fatalf("no %q in %s; output:\n%q", re, timeout, tail(w.String(), 2000))
		}
	}
}

// screenLines is terminal output as the lines it shows: escape sequences
// dropped, each line what follows its last carriage return.
func screenLines(s string) []string {
	s = regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]`).ReplaceAllString(s, "")
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		l = strings.TrimSuffix(l, "\r")
		lines[i] = l[strings.LastIndexByte(l, '\r')+1:]
	}
	return lines
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// shellProc is `gateway shell` running in a PTY the test holds the
// master of.
type shellProc struct {
	ptmx *os.File
	out  *watched
	done chan struct{} // closed when the process has exited
	err  error         // its wait error, once done is closed
}

func startShell(t *testing.T, env []string, args ...string) *shellProc {
	t.Helper()
	cmd := exec.Command(gatewayBin, append([]string{"shell"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	if err != nil {
		t.Fatal(err)
	}
	p := &shellProc{ptmx: ptmx, out: newWatched(), done: make(chan struct{})}
	copied := make(chan struct{})
	go func() {
		io.Copy(p.out, ptmx) // ends with EIO once the shell exits
		close(copied)
	}()
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		ptmx.Close()
		<-copied
	})
	return p
}

func (p *shellProc) send(t *testing.T, s string) {
	t.Helper()
	if _, err := p.ptmx.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// exitStatus waits for the process to exit and returns its status.
func (p *shellProc) exitStatus(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("gateway shell did not exit; output:\n%q", tail(p.out.String(), 2000))
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		t.Fatalf("gateway shell: %v", p.err)
	}
	if ee != nil {
		return ee.ExitCode()
	}
	return 0
}

// `gateway shell` in a real terminal (a PTY the test holds the master
// of): type, read, resize, have the connection cut, and find the terminal
// mode as it was when the shell ends.
func TestShellCommand(t *testing.T) {
	t.Parallel()
	gw := startGateway(t, t.TempDir(), nil)
	proxy := testkit.NewProxy(t, "tcp", strings.TrimPrefix(gw.URL, "http://"))
	id, lease := newSandbox(t, gw.URL)

	sh := startShell(t, []string{"SANDGATE_URL=http://" + proxy.Addr(), "SANDGATE_LEASE=" + lease}, id) // the environment twins
	out, ptmx := sh.out, sh.ptmx
	send := func(s string) { t.Helper(); sh.send(t, s) }
	// TCGETS on a PTY master reads the terminal's (the slave's) modes.
	before, err := unix.IoctlGetTermios(int(ptmx.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	out.waitFor(t, `sandgate: session (pty-\S+)`, 30*time.Second)
	out.waitFor(t, `# $`, 30*time.Second) // the remote prompt
	raw, err := unix.IoctlGetTermios(int(ptmx.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Lflag&(unix.ICANON|unix.ECHO) != 0 {
		t.Errorf("the local terminal is not in raw mode while attached (lflag %#x)", raw.Lflag)
	}

	send("echo hi-$((40+2))\r")
	out.waitFor(t, `[\r\n]hi-42\r\n`, 20*time.Second)

	send("echo S1 $(stty size)\r")
	out.waitFor(t, `[\r\n]S1 24 80\r\n`, 20*time.Second)
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 33, Cols: 101}); err != nil {
		t.Fatal(err)
	}
	// The SIGWINCH travels asynchronously: ask until the new size shows.
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; ; i++ {
		send(fmt.Sprintf("echo S2-%d $(stty size)\r", i))
		m := out.waitFor(t, fmt.Sprintf(`[\r\n]S2-%d (\d+ \d+)\r\n`, i), 20*time.Second)
		if m[1] == "33 101" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stty size stays %s after the resize, want 33 101", m[1])
		}
	}

	// Cut the connection while output flows; every line arrives once.
	const n = 300
	send(fmt.Sprintf("for i in $(seq 1 %d); do echo N$i; sleep 0.005; done; echo LOOP-DONE\r", n))
	out.waitFor(t, `[\r\n]N50\r\n`, 20*time.Second)
	if proxy.Sever() == 0 {
		t.Fatal("no connection to cut")
	}
	out.waitFor(t, `\[sandgate: reconnected\]`, 30*time.Second)
	out.waitFor(t, `[\r\n]LOOP-DONE\r\n`, 30*time.Second)
	var seen []int
	for _, l := range screenLines(out.String()) {
		if v, err := strconv.Atoi(strings.TrimPrefix(l, "N")); err == nil && strings.HasPrefix(l, "N") {
			seen = append(seen, v)
		}
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	if !reflect.DeepEqual(seen, want) {
		t.Errorf("after the cut the terminal got lines %v…, want N1..N%d once each", seen[:min(len(seen), 20)], n)
	}

	send("exit 3\r")
	if code := sh.exitStatus(t); code != 3 {
		t.Errorf("gateway shell exited with status %d, want 3", code)
	}
	after, err := unix.IoctlGetTermios(int(ptmx.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if *after != *before {
		t.Errorf("terminal modes not restored:\nbefore %+v\nafter  %+v", *before, *after)
	}
}

// A second `gateway shell --takeover` evicts the first, which says so,
// exits and does not re-dial.
func TestShellTakeover(t *testing.T) {
	t.Parallel()
	gw := startGateway(t, t.TempDir(), nil)
	id, lease := newSandbox(t, gw.URL)
	flags := []string{"--url", gw.URL, "--lease", lease}
	first := startShell(t, nil, append(flags, id)...)
	sid := first.out.waitFor(t, `sandgate: session (pty-\S+) `, 30*time.Second)[1]
	first.out.waitFor(t, `# $`, 30*time.Second)

	// Without --takeover the second is refused.
	second := startShell(t, nil, append(flags, "--session", sid, id)...)
	if code := second.exitStatus(t); code != exitFailed {
		t.Errorf("second shell without --takeover: status %d, want %d", code, exitFailed)
	}
	second.out.waitFor(t, `use --takeover`, 5*time.Second)

	third := startShell(t, nil, append(flags, "--takeover", "--session", sid, id)...)
	first.out.waitFor(t, `taken over by another client`, 30*time.Second)
	if code := first.exitStatus(t); code != exitFailed {
		t.Errorf("evicted shell: status %d, want %d", code, exitFailed)
	}
	third.send(t, "echo third-$((1+2))\r")
	third.out.waitFor(t, `[\r\n]third-3\r\n`, 20*time.Second)
	third.send(t, "exit 0\r")
	if code := third.exitStatus(t); code != 0 {
		t.Errorf("third shell: status %d", code)
	}
}

func TestExecCommand(t *testing.T) {
	t.Parallel()
	gw := startGateway(t, t.TempDir(), nil)
	id, lease := newSandbox(t, gw.URL)
	run := func(env []string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(gatewayBin, append([]string{"exec"}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return o.String(), e.String(), cmd.ProcessState.ExitCode()
	}
	o, e, code := run(nil, "--url", gw.URL+"/v1", "--lease", lease, id, "--", "echo out; echo err >&2; exit 4")
	if o != "out\n" || e != "err\n" || code != 4 {
		t.Errorf("exec = %q, %q, %d; want out, err, 4", o, e, code)
	}
	// argv after -- is quoted into one command line, exactly.
	o, _, code = run([]string{"SANDGATE_URL=" + gw.URL, "SANDGATE_LEASE=" + lease}, id, "--", "printf", "[%s]", "a b", "it's", "$HOME")
	if o != "[a b][it's][$HOME]" || code != 0 {
		t.Errorf("exec printf = %q, %d", o, code)
	}
	_, e, code = run(nil, "--url", gw.URL, "--lease", "sgl1.bogus", id, "--", "true")
	if code != exitFailed || !strings.Contains(e, "401") {
		t.Errorf("bad lease: status %d, stderr %q", code, e)
	}
	_, e, code = run(nil, "--url", gw.URL, id, "--", "true")
	if code != exitUsage || !strings.Contains(e, "SANDGATE_LEASE") {
		t.Errorf("no lease: status %d, stderr %q", code, e)
	}
}

func TestParseInterleaved(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	s := fs.String("session", "", "")
	b := fs.Bool("takeover", false, "")
	pos, rest, err := parseInterleaved(fs, []string{"--takeover", "sbx-1", "--session", "pty-1", "--", "--not-a-flag", "x"})
	if err != nil || *s != "pty-1" || !*b || !reflect.DeepEqual(pos, []string{"sbx-1"}) || !reflect.DeepEqual(rest, []string{"--not-a-flag", "x"}) {
		t.Errorf("parse = %v %v %v; session %q takeover %v", pos, rest, err, *s, *b)
	}
}

func TestShellQuote(t *testing.T) {
	for argv, want := range map[string]string{
		"ls -la /tmp":    "ls -la /tmp",
		"echo it's":      `echo 'it'\''s'`,
		"printf [%s] $x": `printf '[%s]' '$x'`,
	} {
		if got := shellQuote(strings.Fields(argv)); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", argv, got, want)
		}
	}
	if got := shellQuote([]string{""}); got != "''" {
		t.Errorf("empty arg quoted as %s", got)
	}
}
