package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The E2B face (--e2b) end to end: the E2B JavaScript SDK, pinned in
// internal/e2b/testdata/sdk (make e2b-sdk installs it), run unchanged by
// node's test runner against a real gateway, with only E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY pointing it there.

const e2bKey = "e2b_sandgate_test_key_0123456789"

// TestE2BSDKLocal: the SDK's test file on the local provider (its
// default image: template "base"), its egress test included, against the
// test internet; one snapshot per key, so that a second raises the SDK's
// RateLimitError (as on docker).
func TestE2BSDKLocal(t *testing.T) {
	t.Parallel()
	in := egresstest.Start(t)
	g := startGateway(t, t.TempDir(), nil, "--e2b", "--api-key", e2bKey, "--quota-snapshots", "1",
		"--egress-netns", in.NetnsPath, "--egress-resolve", egresstest.ResolveFlag())
	runE2BSDK(t, g, "", "E2B_TEST_EGRESS=1", "E2B_TEST_SNAPSHOT_QUOTA=1")
}

// TestE2BSDKDocker: the same on the docker provider, the template naming
// the test image (busybox: E2B's /bin/bash falls back to /bin/sh).
func TestE2BSDKDocker(t *testing.T) {
	t.Parallel()
	g := startDockerGateway(t, t.TempDir(), "--e2b", "--api-key", e2bKey, "--quota-snapshots", "1")
	runE2BSDK(t, g, dockertest.ImageRef, "E2B_TEST_SNAPSHOT_QUOTA=1")
}

// e2bPass is the TAP summary line of the passed tests.
var e2bPass = regexp.MustCompile(`(?m)^# pass (\d+)$`)

// runE2BSDK runs the SDK's test file against g, creating from template,
// with env added to its environment.
func runE2BSDK(t *testing.T, g *proc, template string, env ...string) {
	t.Helper()
	runE2BSDKTests(t, g, template, nil, env...)
}

// runE2BSDKTests is runE2BSDK for the tests named in only (each a
// regular expression; all of them when only is empty): every one of them
// must run and pass.
func runE2BSDKTests(t *testing.T, g *proc, template string, only []string, env ...string) {
	t.Helper()
	node, err := exec.LookPath("node")
	testkit.Need(t, "node (apt-get install nodejs)", err)
	dir := filepath.Join("..", "..", "internal", "e2b", "testdata", "sdk")
	_, err = os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	testkit.Need(t, "the pinned E2B SDK (make e2b-sdk)", err)

	// Catches a hang only.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	args := []string{"--test", "--test-reporter=tap"}
	for _, p := range only {
		args = append(args, "--test-name-pattern="+p)
	}
	cmd := exec.CommandContext(ctx, node, append(args, "e2b.test.mjs")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+g.URL+"/e2b/api",
		"E2B_SANDBOX_URL="+g.URL+"/e2b/sandbox",
		"E2B_API_KEY="+e2bKey,
		"E2B_TEST_TEMPLATE="+template,
	)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test e2b.test.mjs: %v\n%s\ngateway:\n%s", err, out, g.stderr)
	}
	m := e2bPass.FindSubmatch(out)
	ok := m != nil && string(m[1]) != "0" && regexp.MustCompile(`(?m)^# fail 0$`).Match(out)
	if len(only) == 0 {
		ok = ok && regexp.MustCompile(`(?m)^# skipped 0$`).Match(out)
	} else {
		ok = ok && string(m[1]) == strconv.Itoa(len(only)) // the others are skipped by name
	}
	if !ok {
		t.Fatalf("the SDK's tests did not all pass:\n%s", out)
	}
	t.Logf("E2B SDK: %s tests passed", m[1])
}

// TestE2BSDKRestart: a background command started through the SDK runs
// on while its gateway is SIGKILLed and started again; the SDK then
// connects to it by pid and reads the rest of its output and its exit. A
// directory watcher (CreateWatcher) made before the restart reports a
// change made after it.
func TestE2BSDKRestart(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	g := startGateway(t, state, nil, "--e2b", "--api-key", e2bKey)
	out := runE2BScript(t, g, "restart.mjs", "start")
	var started struct {
		ID      string `json:"id"`
		PID     int    `json:"pid"`
		Watcher string `json:"watcher"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(out), &started); err != nil || started.ID == "" || started.PID <= 0 || started.Watcher == "" {
		t.Fatalf("phase start: %v\n%s", err, out)
	}
	g.stop(syscall.SIGKILL)
	g2 := startGateway(t, state, nil, "--e2b", "--api-key", e2bKey)
	out = runE2BScript(t, g2, "restart.mjs", "follow",
		"E2B_RESTART_SANDBOX="+started.ID, "E2B_RESTART_PID="+strconv.Itoa(started.PID), "E2B_RESTART_WATCHER="+started.Watcher)
	if !bytes.Contains(out, []byte("followed")) {
		t.Fatalf("phase follow: %s", out)
	}
}

// runE2BScript runs node on script of the SDK's directory with args,
// against g, and returns its stdout; a failure fails t.
func runE2BScript(t *testing.T, g *proc, script string, arg string, env ...string) []byte {
	t.Helper()
	node, err := exec.LookPath("node")
	testkit.Need(t, "node (apt-get install nodejs)", err)
	dir := filepath.Join("..", "..", "internal", "e2b", "testdata", "sdk")
	_, err = os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	testkit.Need(t, "the pinned E2B SDK (make e2b-sdk)", err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // catches a hang only
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, arg)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(),
		"E2B_API_URL="+g.URL+"/e2b/api",
		"E2B_SANDBOX_URL="+g.URL+"/e2b/sandbox",
		"E2B_API_KEY="+e2bKey,
	), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s %s: %v\n%s%s\ngateway:\n%s", script, arg, err, out, stderr.Bytes(), g.stderr)
	}
	return out
}
