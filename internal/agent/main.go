package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// SocketPath is where the agent listens inside a sandbox: on /dev, a
// tmpfs every container has, writable even with a read-only root.
const SocketPath = "/dev/.sandgate-agent.sock"

// Main is the agent binary:
//
//	sandgate-agent serve [--socket P]            the daemon: holds sessions, serves connections
//	sandgate-agent connect [--socket P] [--start] bridge stdin/stdout to the daemon (starting it with --start)
//	sandgate-agent stdio                          serve one connection on stdin/stdout
//	sandgate-agent install [--stay] DEST          copy this binary to DEST (a Kubernetes sidecar: --stay waits for SIGTERM)
//	sandgate-agent version
func Main(args []string) int {
	if len(args) < 1 {
		fmt.Fprintln(os.Stderr, "usage: sandgate-agent serve|connect|stdio|install|version")
		return 2
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	sock := fs.String("socket", SocketPath, "the daemon's unix socket")
	start := fs.Bool("start", false, "connect: start the daemon if none listens")
	stay := fs.Bool("stay", false, "install: then wait for SIGTERM (a Kubernetes sidecar)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(*sock)
	case "connect":
		err = connect(*sock, *start)
	case "stdio":
		reserveThreads(reservedThreads)
		srv := NewServer(false)
		err = srv.Serve(stdio{}, func() { os.Exit(0) })
	case "install":
		if fs.NArg() != 1 {
			fmt.Fprintln(os.Stderr, "usage: sandgate-agent install [--stay] DEST")
			return 2
		}
		if err = install(fs.Arg(0)); err == nil && *stay {
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
			<-sig
		}
	case "version":
		fmt.Println(build())
	default:
		err = fmt.Errorf("unknown command %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-agent:", err)
		return 1
	}
	return 0
}

// serve is the daemon: it listens on sock until killed. It refuses to
// start when another daemon answers there.
func serve(sock string) error {
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		return errors.New("an agent already listens on " + sock)
	}
	os.Remove(sock)
	old := syscall.Umask(0o077)
	l, err := net.Listen("unix", sock)
	syscall.Umask(old)
	if err != nil {
		return err
	}
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	reserveThreads(reservedThreads)
	srv := NewServer(false)
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go srv.Serve(c, func() { os.Exit(0) })
	}
}

// connect bridges stdin and stdout to the daemon on sock. With start it
// starts the daemon first when none answers (the sandbox's first
// connection); without, a missing daemon is an error: the agent died.
func connect(sock string, start bool) error {
	// The bridge, too, must not need a new thread while the sandbox is at
	// its pids limit: its two copies block in system calls.
	reserveThreads(reservedThreads / 2)
	c, err := net.Dial("unix", sock)
	if err != nil && start {
		self, _ := os.Executable()
		cmd := exec.Command(self, "serve", "--socket", sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		// What the daemon says when it dies (a Go runtime's fatal error)
		// is kept beside its socket, for the bridge that finds it gone.
		log, _ := os.OpenFile(logPath(sock), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if log != nil {
			cmd.Stderr = log
		}
		serr := cmd.Start()
		if log != nil {
			log.Close() // the daemon has its own
		}
		if serr != nil {
			return fmt.Errorf("start the agent: %w", serr)
		}
		go cmd.Wait()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if c, err = net.Dial("unix", sock); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if err != nil {
		return fmt.Errorf("no agent answers on %s: %w%s", sock, err, lastWords(logPath(sock)))
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(c, os.Stdin)
		c.(*net.UnixConn).CloseWrite()
	}()
	io.Copy(os.Stdout, c)
	return nil
}

// install copies the running binary to dest (Install): how a
// Kubernetes init container of the agent's image puts the agent into a
// volume the sandbox's container shares.
func install(dest string) error { return Install("/proc/self/exe", dest) }

// Install copies the file src to dest, mode 0755, replacing dest
// atomically (a sandbox's container may run it meanwhile). The pods'
// egress point (cmd/sandgate-egress) installs the agent with it too.
func Install(src, dest string) error {
	self, err := os.Open(src)
	if err != nil {
		return err
	}
	defer self.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".sandgate-agent-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, self); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dest)
}

// logPath is where the daemon on sock writes its standard error.
func logPath(sock string) string { return strings.TrimSuffix(sock, ".sock") + ".log" }

// lastWords is the first line of the daemon's log at path (a Go
// runtime's fatal error, panic or signal), as "; its last words: ...",
// or "" when it said nothing.
func lastWords(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 4<<10))
	for _, line := range strings.Split(strings.ToValidUTF8(string(b), "?"), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			if len(line) > 300 {
				line = line[:300] + "..."
			}
			return "; its last words: " + line
		}
	}
	return ""
}

// stdio is stdin and stdout as one stream.
type stdio struct{}

func (stdio) Read(p []byte) (int, error)  { return os.Stdin.Read(p) }
func (stdio) Write(p []byte) (int, error) { return os.Stdout.Write(p) }
func (stdio) Close() error                { os.Stdin.Close(); return os.Stdout.Close() }

// reservedThreads is how many OS threads the agent makes at its start.
const reservedThreads = 16

// reserveThreads makes n OS threads while it can: the Go runtime keeps
// them idle for later, so an agent in a sandbox at its pids limit (a
// fork bomb) still has threads for its blocking calls instead of dying on
// a failed clone.
func reserveThreads(n int) {
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			runtime.LockOSThread()
			wg.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	wg.Wait()
	close(release)
}
