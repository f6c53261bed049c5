package main

import (
	"bufio"
	"bytes"
	"context"
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
)

// gatewayBin is the gateway built once for the tests that run it as a real
// process (cgo-free, as `make build` builds it).
var gatewayBin string

// agentBin is the sandgate-agent built beside it: the docker provider's
// agent, and the local provider's init binary.
func agentBin() string { return filepath.Join(filepath.Dir(gatewayBin), "sandgate-agent") }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sandgate-bin-")
	if err != nil {
		panic(err)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-o", gatewayBin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build gateway: %v\n%s", err, out)
		os.Exit(1)
	}
	// The docker provider finds the agent beside the gateway, as make
	// build places it.
	build = exec.Command("go", "build", "-o", agentBin(), "../sandgate-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		os.Exit(1)
	}
	// goleak exits through Cleanup, which removes the binaries first.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
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
func (p *proc) stop(sig syscall.Signal) error {
	if p.cmd.ProcessState != nil {
		return nil
	}
	p.cmd.Process.Signal(sig)
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
