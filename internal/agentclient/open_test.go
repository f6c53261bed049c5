package agentclient

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestOpenLies: an agent that answers open with anything but one
// regular file (a pipe the gateway's read would block on for ever, two
// descriptors, none) breaks the protocol: the call fails, the client is
// cut, and no descriptor stays open in the gateway.
func TestOpenLies(t *testing.T) {
	pipe := func() []*os.File {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); w.Close() })
		return []*os.File{r}
	}
	file := func() *os.File {
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	for name, send := range map[string]func() []*os.File{
		"a pipe":   pipe,
		"two":      func() []*os.File { return []*os.File{file(), file()} },
		"none":     func() []*os.File { return nil },
		"a socket": func() []*os.File { return []*os.File{unixFile(t)} },
	} {
		t.Run(name, func(t *testing.T) {
			files := send()
			c := dialLiar(t, func(agentwire.Request, net.Conn) {})
			sock := serveDirect(t, func(uc *net.UnixConn) {
				b, _ := agentwire.MarshalMsg(agentwire.Reply{})
				var fds []int
				for _, f := range files {
					fds = append(fds, int(f.Fd()))
				}
				var oob []byte
				if len(fds) > 0 {
					oob = syscall.UnixRights(fds...)
				}
				uc.WriteMsgUnix(b, oob, nil)
			})
			c.direct = func(ctx context.Context) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}
			before := fdCount(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			f, err := c.Open(ctx, "/etc/passwd", false)
			if err == nil {
				f.Close()
				t.Fatal("open took the lie")
			}
			if providers.Kind(err) != providers.ErrConflict || !strings.Contains(c.Violation(), "open answered with") {
				t.Errorf("open: %v; violation %q", err, c.Violation())
			}
			// Other tests' connections may still be closing: what counts
			// is that the lie's descriptors are closed soon, not at once.
			testkit.Eventually(t, "the lie's descriptors closed", 10*time.Second, func() bool { return fdCount(t) <= before })
		})
	}
}

// serveDirect answers each direct connection on a fresh unix socket
// with answer, once it has read the magic and the request.
func serveDirect(t *testing.T, answer func(*net.UnixConn)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "direct.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			uc, err := l.AcceptUnix()
			if err != nil {
				return
			}
			magic := make([]byte, len(agentwire.DirectMagic))
			var req agentwire.Request
			if _, err := io.ReadFull(uc, magic); err == nil && agentwire.ReadMsg(uc, &req, agentwire.MaxRequest) == nil {
				answer(uc)
			}
			uc.Close()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return sock
}

func unixFile(t *testing.T) *os.File {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "socket")
	t.Cleanup(func() { f.Close() })
	return f
}

func fdCount(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
