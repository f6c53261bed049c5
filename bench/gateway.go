package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// gateway is a gateway process the harness started on loopback.
type gateway struct {
	provider string
	URL      string // http://127.0.0.1:port
	state    string
	cmd      *exec.Cmd
	hc       *http.Client
}

// startGateway runs bin serve with provider on a free loopback port and a
// fresh state directory, and waits for it to listen.
func startGateway(bin, provider string, extra ...string) (*gateway, error) {
	state, err := os.MkdirTemp("", "sandgate-bench-")
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", state, "--provider", provider,
		"--max-sandboxes", "2000", "--overcommit", "0", "--disk-overcommit", "0", "--max-pty-per-sandbox", "1024", "--log-level", "warn"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &gateway{provider: provider, state: state, cmd: cmd,
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096}}}
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if rest, ok := strings.CutPrefix(lines.Text(), "sandgate is listening on "); ok {
			g.URL, _, _ = strings.Cut(rest, " ")
			break
		}
	}
	if g.URL == "" {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, errors.New("the gateway did not start (see its log above)")
	}
	go io.Copy(io.Discard, out)
	return g, nil
}

// stop deletes every sandbox left (local sandboxes outlive the gateway
// by design) and stops the gateway.
func (g *gateway) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var list struct {
		Sandboxes []struct {
			ID string `json:"sandbox_id"`
		} `json:"sandboxes"`
	}
	if err := g.do(ctx, "GET", "/v1/sandboxes?limit=1000", "", nil, &list); err == nil {
		for _, s := range list.Sandboxes {
			g.delete(ctx, ref{ID: s.ID})
		}
	}
	g.hc.CloseIdleConnections()
	g.cmd.Process.Signal(syscall.SIGTERM)
	g.cmd.Wait()
	os.RemoveAll(g.state)
}

// usage is the gateway's CPU time so far and its peak resident memory.
func (g *gateway) usage() (cpu time.Duration, peakRSS int64) {
	pid := strconv.Itoa(g.cmd.Process.Pid)
	if b, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th.
		if i := bytes.LastIndexByte(b, ')'); i > 0 {
			f := strings.Fields(string(b[i+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				s, _ := strconv.ParseInt(f[12], 10, 64)
				cpu = time.Duration(u+s) * time.Second / 100 // USER_HZ
			}
		}
	}
	return cpu, g.status("VmHWM")
}

// status is a memory line of /proc/<gateway>/status, in bytes.
func (g *gateway) status(key string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(g.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// metric is a gauge of the gateway's /metrics (0 if missing).
func (g *gateway) metric(ctx context.Context, name string) float64 {
	req, _ := http.NewRequestWithContext(ctx, "GET", g.URL+"/metrics", nil)
	res, err := g.hc.Do(req)
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	s := bufio.NewScanner(res.Body)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), name+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return 0
}

// ref is a sandbox and its owner lease.
type ref struct {
	ID  string `json:"sandbox_id"`
	Tok string `json:"lease_token"`
}

// do sends a JSON request (body "" for none) and decodes a JSON answer
// into out (nil: discard); a status of 300 or more is an error.
func (g *gateway) do(ctx context.Context, method, path, tok string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, g.URL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("X-Sandbox-Lease", tok)
	}
	res, err := g.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		b, _ := io.ReadAll(res.Body)
		return fmt.Errorf("%s %s: %d %s", method, path, res.StatusCode, bytes.TrimSpace(b))
	}
	if out == nil {
		_, err = io.Copy(io.Discard, res.Body)
		return err
	}
	return json.NewDecoder(res.Body).Decode(out)
}

func (g *gateway) create(ctx context.Context, req map[string]any) (ref, error) {
	var r ref
	err := g.do(ctx, "POST", "/v1/sandboxes", "", req, &r)
	return r, err
}

func (g *gateway) delete(ctx context.Context, r ref) error {
	return g.do(ctx, "DELETE", "/v1/sandboxes/"+r.ID, r.Tok, nil, nil)
}

// exec runs command and fails unless it exits 0.
func (g *gateway) exec(ctx context.Context, r ref, command string) (string, error) {
	var res struct {
		Stdout     string `json:"stdout"`
		Stderr     string `json:"stderr"`
		ReturnCode int    `json:"return_code"`
	}
	if err := g.do(ctx, "POST", "/v1/sandboxes/"+r.ID+"/exec", r.Tok, map[string]any{"command": command, "timeout_s": 300}, &res); err != nil {
		return "", err
	}
	if res.ReturnCode != 0 {
		return res.Stdout, fmt.Errorf("%q exited %d: %s", command, res.ReturnCode, res.Stderr)
	}
	return res.Stdout, nil
}

// upload streams body to path in the sandbox.
func (g *gateway) upload(ctx context.Context, r ref, path string, body io.Reader) error {
	req, err := http.NewRequestWithContext(ctx, "PUT", g.URL+"/v1/sandboxes/"+r.ID+"/files?path="+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("X-Sandbox-Lease", r.Tok)
	res, err := g.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	io.Copy(io.Discard, res.Body)
	if res.StatusCode >= 300 {
		return fmt.Errorf("upload %s: %d", path, res.StatusCode)
	}
	return nil
}

// download streams path in the sandbox into w and returns its size.
func (g *gateway) download(ctx context.Context, r ref, path string, w io.Writer) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", g.URL+"/v1/sandboxes/"+r.ID+"/files?path="+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Sandbox-Lease", r.Tok)
	res, err := g.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if res.StatusCode >= 300 {
		return 0, fmt.Errorf("download %s: %d", path, res.StatusCode)
	}
	return io.Copy(w, res.Body)
}
