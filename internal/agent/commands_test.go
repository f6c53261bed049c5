package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
)

// TestCommandKeepsWhatItsReaderWasBehindOn: when a command's tree ends
// while its output reader is far behind (a busy machine) and a preserved
// background process holds the pipe (so no EOF comes), what the pipe held
// at the end is the command's output, all of it, not dropped at the grace.
func TestCommandKeepsWhatItsReaderWasBehindOn(t *testing.T) {
	srv := NewServer(true)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	catchUp := make(chan struct{})
	testHookCatchUp = func() { close(catchUp) }
	t.Cleanup(func() { testHookCatchUp = nil })

	const size = 60000 // under the pipe's 64 KiB: the writer never waits for the reader
	c, err := srv.startCommand(agentwire.ExecRequest{
		Command:            fmt.Sprintf("sleep 300 & echo $! > %s/bg; read x < %s; head -c %d /dev/zero | tr '\\0' x", dir, fifo, size),
		PreserveBackground: true,
		TimeoutMS:          60000,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b, _ := os.ReadFile(filepath.Join(dir, "bg"))
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		c.stop()
	})
	c.mu.Lock() // the reader stalls at its first append
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		c.mu.Unlock()
		t.Fatal(err)
	}
	w.Write([]byte("go\n"))
	w.Close()
	select {
	case <-catchUp: // the tree ended and the grace passed, the reader still stalled
	case <-time.After(time.Minute):
		c.mu.Unlock()
		t.Fatal("the command did not end")
	}
	c.mu.Unlock()
	<-c.done
	info := c.info()
	if info.StdoutSize != size || c.res.ExitCode != 0 {
		t.Fatalf("stdout %d bytes, exit %d; want %d, 0", info.StdoutSize, c.res.ExitCode, size)
	}
}
