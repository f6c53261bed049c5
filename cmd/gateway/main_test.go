package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers/local"
	"github.com/sandgate/sandgate/internal/testkit"
)

// gatewayBin is the gateway built once for the tests that run it as a real
// process (cgo-free, as `make build` builds it).
var gatewayBin string

// agentBin is the sandgate-agent built beside it: the docker provider's
// agent, and the local provider's init binary.
func agentBin() string { return filepath.Join(filepath.Dir(gatewayBin), "sandgate-agent") }

func TestMain(m *testing.M) {
	flag.Parse()
	// The tests wait on gateways, sandboxes, daemons, the cluster and a
	// browser: six at once keep two cores busy.
	testkit.WaitingParallel(6)
	var err error
	if gatewayBin, err = testkit.BuildGateway(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if selected("TestContainerImage") || selected("TestKubernetesDeployment") {
		startGatewayImage()
	}
	code := m.Run()
	// The build goroutine is joined before goleak looks (VerifyTestMain
	// would look first).
	stopGatewayImage()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// selected reports whether the -run and -skip flags let the top-level
// test name run: -run's first element matches it, and -skip has one
// element only (more name subtests) that does not. A bad pattern selects
// it (go test reports the pattern); -list runs nothing.
func selected(name string) bool {
	flagOf := func(f string) string { return flag.Lookup(f).Value.String() }
	if flagOf("test.list") != "" {
		return false
	}
	matches := func(pattern string) bool {
		ok, err := regexp.MatchString(pattern, name)
		return ok || err != nil
	}
	run, skip := flagOf("test.run"), flagOf("test.skip")
	if run != "" && !matches(strings.Split(run, "/")[0]) {
		return false
	}
	return skip == "" || strings.Contains(skip, "/") || !matches(skip)
}

// proc is a gateway running as a real process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	URL    string // http://127.0.0.1:PORT
	stderr *syncBuffer
	done   chan error
}

// startGateway runs the gateway binary with args on a free loopback port
// and waits until it prints its URL.
func startGateway(t *testing.T, stateDir string, env []string, args ...string) *proc {
	t.Helper()
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", stateDir, "--log-level", "debug"}, args...)
	cmd := exec.Command(gatewayBin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, stderr: &syncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`listening on (http://\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urlc <- m[1]
			}
		}
		io.Copy(io.Discard, stdout)
		p.done <- cmd.Wait()
	}()
	select {
	case p.URL = <-urlc:
	case err := <-p.done:
		t.Fatalf("gateway exited before listening: %v\n%s", err, p.stderr)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-p.done
		t.Fatalf("gateway did not start in 30s\n%s", p.stderr)
	}
	t.Cleanup(func() {
		p.stop(syscall.SIGKILL)
		reapSandboxes(t, stateDir)
	})
	return p
}

// reapSandboxes deletes every sandbox left in a gateway's state dir:
// sandboxes outlive the gateway by design, but not the test.
func reapSandboxes(t *testing.T, stateDir string) {
	l, err := local.New(local.Options{StateDir: filepath.Join(stateDir, "local")})
	if err != nil {
		t.Errorf("reap sandboxes: %v", err)
		return
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	owned, err := l.List(ctx)
	if err != nil {
		t.Errorf("reap sandboxes: %v", err)
	}
	for _, o := range owned {
		if err := l.Delete(ctx, o.ID); err != nil {
			t.Errorf("reap sandbox %s: %v", o.ID, err)
		}
	}
}

// stop sends sig and waits for the process to exit; it returns the wait error.
// It is safe to call again: done hands the first wait's error back. (It
// reads no ProcessState: the waiting goroutine writes it.)
func (p *proc) stop(sig syscall.Signal) error {
	p.cmd.Process.Signal(sig) // an error once the process is gone: done answers

	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(60 * time.Second):
		p.cmd.Process.Kill()
		return <-p.done
	}
}

// syncBuffer is a bytes.Buffer safe to write from the process's copier
// while a test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// call sends one JSON request and returns status and body.
func call(t *testing.T, method, url string, body string, hdr ...string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, data
}
