package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestSweepCatchesExecve: a process inside an execve shows an empty
// environment for a moment, and a sweep that read it then passed the
// process by, so a command's setsid leftover that was starting its
// program as the command ended lived on. Here a process that execs itself
// in a loop is swept right after it starts (its first execve is barely
// past the point of no return), which lands inside an execve a few times
// in a hundred.
func TestSweepCatchesExecve(t *testing.T) {
	script := filepath.Join(t.TempDir(), "loop.sh")
	if err := os.WriteFile(script, []byte("exec /bin/sh "+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	const marker = "SANDGATE_EXEC=sweep-test"
	var r Reaper
	for i := range 300 {
		cmd := exec.Command("/bin/sh", script)
		cmd.Env = []string{marker}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.sweep(0, marker)
		exited := make(chan struct{})
		go func() {
			cmd.Wait()
			close(exited)
		}()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Fatalf("sweep %d passed by a marked process", i)
		}
	}
}

// TestSweepSparesEmptyEnvironment: a process with no environment at all
// (as env -i leaves it) is neither taken for one inside an execve, which
// would hold every sweep for execPatience, nor killed.
func TestSweepSparesEmptyEnvironment(t *testing.T) {
	cmd := exec.Command("sleep", "300")
	cmd.Env = []string{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	pid := cmd.Process.Pid
	testkit.Eventually(t, "sleep's execve to finish", 10*time.Second, func() bool {
		st, err := procfs.ReadStat("/proc", pid)
		return err == nil && !st.Execing
	})
	const marker = "SANDGATE_EXEC=sweep-test"
	if yes, unknown := marked(pid, []byte(marker+"\x00")); yes || unknown {
		t.Fatalf("an empty environment: marked %v, unknown %v", yes, unknown)
	}
	var r Reaper
	r.sweep(0, marker)
	if zombie(pid) {
		t.Fatal("an unmarked process was killed")
	}
}
