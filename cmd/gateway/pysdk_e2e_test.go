package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The Python SDK (clients/python) against real gateways: the package is
// installed with pip from a copy of its sources (no index, the Debian
// packages as its dependencies), then its pytest suite runs against a
// gateway on each provider. The suite covers the sync and async clients,
// the examples and the models' match with api/openapi.yaml.

// sdkPython is Debian's interpreter: the SDK is built for the versions of
// httpx, websockets and pytest that Debian bookworm ships.
const sdkPython = "/usr/bin/python3"

// sdkAPIKey is the key the SDK tests' gateways take.
const sdkAPIKey = "pysdk-key"

// TestPythonSDKLocal runs the SDK's suite against a gateway on the local
// provider.
func TestPythonSDKLocal(t *testing.T) {
	t.Parallel()
	site := installPythonSDK(t)
	state := t.TempDir()
	removeVolumesAfter(t, filepath.Join(state, "local", "volumes"))
	g := startGateway(t, state, nil, "--api-key", sdkAPIKey)
	runPythonSDK(t, g, site, "local", "")
}

// TestPythonSDKDocker runs the SDK's suite against a gateway on the
// docker provider, sandboxes of the test image.
func TestPythonSDKDocker(t *testing.T) {
	t.Parallel()
	site := installPythonSDK(t)
	state := t.TempDir()
	removeVolumesAfter(t, filepath.Join(state, "docker-volumes"))
	g := startDockerGateway(t, state, "--api-key", sdkAPIKey)
	runPythonSDK(t, g, site, "docker", dockertest.ImageRef)
}

// installPythonSDK checks the Python side's dependencies (a skip with the
// reason, a failure in CI) and pip-installs the SDK from a copy of
// clients/python (pip writes build files beside the sources) into a
// directory of its own, which it returns (for PYTHONPATH).
func installPythonSDK(t *testing.T) string {
	t.Helper()
	_, err := os.Stat(sdkPython)
	testkit.Need(t, "Debian's python3 (apt-get install python3)", err)
	const pkgs = "python3-httpx python3-websockets python3-pytest python3-pytest-asyncio python3-yaml python3-pip"
	if out, err := exec.Command(sdkPython, "-c", "import httpx, websockets, pytest, pytest_asyncio, yaml, pip").CombinedOutput(); err != nil {
		testkit.Need(t, "the SDK's Python packages (apt-get install "+pkgs+")", fmt.Errorf("%v: %s", err, lastLine(out)))
	}
	src := t.TempDir()
	if err := os.CopyFS(src, os.DirFS(filepath.Join("..", "..", "clients", "python"))); err != nil {
		t.Fatal(err)
	}
	site := t.TempDir()
	ctx := testkit.Context(t, 2*time.Minute)
	cmd := exec.CommandContext(ctx, sdkPython, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation",
		"--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--root-user-action=ignore", "--target", site, src)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./clients/python: %v\n%s", err, out)
	}
	return site
}

// runPythonSDK runs the SDK's tests (the installed copy's sources are not
// on the path: the tests import what pip installed) against gateway g.
func runPythonSDK(t *testing.T, g *proc, site, provider, image string) {
	t.Helper()
	tests, err := filepath.Abs(filepath.Join("..", "..", "clients", "python", "tests"))
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := filepath.Abs(filepath.Join("..", "..", "api", "openapi.yaml"))
	readme, _ := filepath.Abs(filepath.Join("..", "..", "README.md"))
	ctx := testkit.Context(t, 5*time.Minute)
	cmd := exec.CommandContext(ctx, sdkPython, "-m", "pytest", "-q", "-rfEs", "--durations=6", "-p", "no:cacheprovider", tests)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+site,
		"PYTHONDONTWRITEBYTECODE=1",
		"SANDGATE_URL="+g.URL,
		"SANDGATE_API_KEY="+sdkAPIKey,
		"SANDGATE_PROVIDER="+provider,
		"SANDGATE_IMAGE="+image,
		"SANDGATE_OPENAPI="+spec,
		"SANDGATE_README="+readme,
		"SANDGATE_EXPECT_INSTALLED="+site,
	)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) || ctx.Err() != nil {
			t.Fatalf("pytest on %s: %v\n%s\ngateway log:\n%s", provider, err, out, lastLines(g.stderr.String(), 40))
		}
		t.Fatal(err)
	}
	summary := lastLine(out)
	t.Logf("pytest on %s in %s: %s\n%s", provider, time.Since(start).Round(time.Millisecond), summary, slowest(out))
	passed := regexp.MustCompile(`(\d+) passed`).FindStringSubmatch(summary)
	if passed == nil || passed[1] == "0" {
		t.Fatalf("pytest on %s passed nothing:\n%s", provider, out)
	}
	if strings.Contains(summary, "skipped") && testkit.CI() {
		t.Fatalf("pytest on %s skipped tests in CI:\n%s", provider, out)
	}
}

// slowest returns pytest's --durations table from its output.
func slowest(out []byte) string {
	_, table, ok := strings.Cut(string(out), "slowest ")
	if !ok {
		return ""
	}
	table, _, _ = strings.Cut(table, "\n\n")
	return "slowest " + table
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
