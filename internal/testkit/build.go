package testkit

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Module is the module path of sandgate's packages, for Build.
const Module = "github.com/sandgate/sandgate"

var (
	buildMu sync.Mutex
	builds  = map[string]*built{} // by buildKey
)

type built struct {
	once sync.Once
	path string
	err  error
}

// Build builds the main package pkg (an import path, or a path relative
// to the module root such as "cmd/gateway") with CGO_ENABLED=0, as `make
// build` does, once per test binary per (pkg, name, ldflags), and returns
// the binary's path. Binaries named alike land in one directory, so the
// gateway finds the sandgate-agent beside it. The directory is keyed by
// the module's location and reused by later runs (each process still
// builds once; go's build cache makes that quick), so nothing piles up
// in the temp dir. Safe to call from TestMain and from several goroutines.
func Build(pkg, name, ldflags string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(pkg, Module) {
		pkg = Module + "/" + strings.TrimPrefix(pkg, "./")
	}
	key := root + "\x00" + ldflags
	buildMu.Lock()
	b := builds[key+"\x00"+pkg+"\x00"+name]
	if b == nil {
		b = &built{}
		builds[key+"\x00"+pkg+"\x00"+name] = b
	}
	buildMu.Unlock()
	b.once.Do(func() {
		sum := sha256.Sum256([]byte(key))
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("sandgate-testbin-%d", os.Getuid()), hex.EncodeToString(sum[:8]))
		if b.err = os.MkdirAll(dir, 0o755); b.err != nil {
			return
		}
		// Built under a name of its own and renamed into place: test
		// binaries of other packages may build and run the same one now.
		tmp, err := os.CreateTemp(dir, name+".build-")
		if err != nil {
			b.err = err
			return
		}
		tmp.Close()
		defer os.Remove(tmp.Name())
		args := []string{"build", "-o", tmp.Name()}
		if ldflags != "" {
			args = append(args, "-ldflags", ldflags)
		}
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("build %s: %v\n%s", pkg, err, out)
			return
		}
		b.path = filepath.Join(dir, name)
		b.err = os.Rename(tmp.Name(), b.path)
	})
	return b.path, b.err
}

// Binary is Build for a test: it fails t if the build fails.
func Binary(t testing.TB, pkg, name, ldflags string) string {
	t.Helper()
	path, err := Build(pkg, name, ldflags)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Agent returns the static sandgate-agent, built once per test binary.
func Agent(t testing.TB) string {
	t.Helper()
	return Binary(t, "cmd/sandgate-agent", "sandgate-agent", "")
}

// Gateway returns the gateway binary with the sandgate-agent beside it
// (where the docker and kubernetes providers look for it), both built
// once per test binary.
func Gateway(t testing.TB) string {
	t.Helper()
	Agent(t)
	return Binary(t, "cmd/gateway", "gateway", "")
}

// BuildGateway is Gateway for TestMain: it builds the agent and the
// gateway beside it and returns the gateway's path.
func BuildGateway() (string, error) {
	if _, err := Build("cmd/sandgate-agent", "sandgate-agent", ""); err != nil {
		return "", err
	}
	return Build("cmd/gateway", "gateway", "")
}

// moduleRoot is the directory holding go.mod above the working directory
// (a test runs in its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
