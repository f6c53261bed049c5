// Package agenttest builds the static sandgate-agent binary for tests of
// providers whose sandboxes run it.
package agenttest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	once sync.Once
	path string
	err  error
)

// Binary builds the static sandgate-agent once per test process and
// returns its path (in a directory of its own under the system temp dir,
// shared by the process's tests).
func Binary(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dir, derr := os.MkdirTemp("", "sandgate-agent-")
		if derr != nil {
			err = derr
			return
		}
		path = filepath.Join(dir, "sandgate-agent")
		cmd := exec.Command("go", "build", "-o", path, "github.com/sandgate/sandgate/cmd/sandgate-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("build the agent: %v\n%s", berr, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}
