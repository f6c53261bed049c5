// Command sandgate-egress is a Kubernetes sandbox pod's egress point
// (point.PodPoint): a container of the pod, the only one holding
// NET_ADMIN, that installs the pod's nftables rules and runs the DNS
// server and TCP proxy every connection of the pod's other containers is
// sent to. It ships in the agent's image beside sandgate-agent, which
// stays small (this one links the DNS, HTTP and nftables code).
//
//	sandgate-egress serve --dir DIR [--resolve name=addr,...] [--install-agent DEST]
//	sandgate-egress ready --dir DIR     (the container's postStart hook)
//	sandgate-egress set --dir DIR < {"policy": ..., "peers": [...]}
//	sandgate-egress show --dir DIR      (the state last set)
//
// DIR (a volume of this container alone) holds the control socket and
// the state (policy and group peers) last set, which a restarted point
// starts from.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agent"
	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/point"
)

// State is what set hands the point, and what it keeps in DIR: a field
// left out keeps its value.
type State struct {
	Policy *egress.Policy `json:"policy,omitempty"`
	Peers  []netip.Addr   `json:"peers,omitempty"`
}

// agentImagePath is the agent's binary in the image both ship in.
const agentImagePath = "/sandgate-agent"

// maxState bounds a set's message.
const maxState = 1 << 20

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: sandgate-egress serve|ready|set|show --dir DIR")
		return 2
	}
	fs := flag.NewFlagSet("sandgate-egress "+args[0], flag.ContinueOnError)
	dir := fs.String("dir", "/run/sandgate-egress", "the point's directory: control socket and state")
	resolve := fs.String("resolve", "", "serve: static DNS answers, name=addr,...")
	agentDest := fs.String("install-agent", "", "serve: first copy the image's /sandgate-agent there (the pod's agent sidecar's work, one container start sooner)")
	wait := fs.Duration("timeout", 10*time.Second, "ready, set: how long to wait for the point")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(*dir, *resolve, *agentDest)
	case "ready":
		err = ready(*dir, *wait)
	case "set":
		err = set(*dir, os.Stdin, *wait)
	case "show":
		var b []byte
		if b, err = os.ReadFile(statePath(*dir)); errors.Is(err, os.ErrNotExist) {
			b, err = []byte("{}"), nil
		}
		os.Stdout.Write(append(b, '\n'))
	default:
		err = fmt.Errorf("unknown command %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandgate-egress:", err)
		return 1
	}
	return 0
}

func sockPath(dir string) string  { return filepath.Join(dir, "ctl.sock") }
func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// serve runs the point until SIGTERM, having installed the agent at
// agentDest ("": not). The control socket is made last: ready (the
// postStart hook) returns once the agent and the rules are in place, so
// no other container of the pod starts before them.
func serve(dir, resolve, agentDest string) error {
	// Not dumpable: another container's root (the pod shares its process
	// namespace) gets no handle on this process's memory or files.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl: %w", err)
	}
	static, err := point.ParseResolve(resolve)
	if err != nil {
		return fmt.Errorf("--resolve %w", err)
	}
	st := State{Policy: &egress.Policy{Mode: egress.ModeNone}}
	if b, err := os.ReadFile(statePath(dir)); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("state %s: %w", statePath(dir), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if agentDest != "" {
		if err := agent.Install(agentImagePath, agentDest); err != nil {
			return fmt.Errorf("install the agent: %w", err)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pp, err := point.StartPod(point.PodOptions{Resolve: static, Logger: log}, *st.Policy, st.Peers)
	if err != nil {
		return err
	}
	defer pp.Close()
	_ = os.Remove(sockPath(dir))
	ln, err := net.Listen("unix", sockPath(dir))
	if err != nil {
		return err
	}
	ctl := &control{dir: dir, pp: pp, st: st, log: log}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctl.serve(ln)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ln.Close()
	<-done
	return nil
}

// control serves set's connections, one at a time.
type control struct {
	dir string
	pp  *point.PodPoint
	log *slog.Logger

	mu sync.Mutex
	st State // guarded by mu
}

func (c *control) serve(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		reply := "ok"
		r := bufio.NewReader(io.LimitReader(conn, maxState))
		if _, err := r.Peek(1); err != nil {
			conn.Close() // ready's probe: nothing to apply
			continue
		}
		if err := c.apply(r); err != nil {
			reply = "error: " + err.Error()
			c.log.Warn("set", "err", err)
		}
		_, _ = io.WriteString(conn, reply+"\n")
		conn.Close()
	}
}

// apply reads one State and makes it the point's, then keeps it in DIR.
func (c *control) apply(r io.Reader) error {
	var in State
	if err := json.NewDecoder(r).Decode(&in); err != nil {
		return fmt.Errorf("bad state: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in.Peers != nil {
		if err := c.pp.SetPeers(in.Peers); err != nil {
			return err
		}
		c.st.Peers = in.Peers
	}
	if in.Policy != nil {
		c.pp.SetPolicy(*in.Policy)
		c.st.Policy = in.Policy
	}
	b, err := json.Marshal(c.st)
	if err != nil {
		return err
	}
	tmp := statePath(c.dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(c.dir))
}

// ready waits until the point's control socket answers.
func ready(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		c, err := net.Dial("unix", sockPath(dir))
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the point did not start within %v: %w", wait, err)
		}
		time.Sleep(5 * time.Millisecond) // polling a socket another process makes
	}
}

// set hands the point the State read from r (one JSON value: the exec's
// stdin need not be closed) and reports its answer.
func set(dir string, r io.Reader, wait time.Duration) error {
	var b json.RawMessage
	if err := json.NewDecoder(io.LimitReader(r, maxState)).Decode(&b); err != nil {
		return fmt.Errorf("bad state: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("bad state: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sockPath(dir))
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write(b); err != nil {
		return err
	}
	_ = conn.(*net.UnixConn).CloseWrite()
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no answer from the point: %w", err)
	}
	if line = strings.TrimSpace(line); line != "ok" {
		return errors.New(strings.TrimPrefix(line, "error: "))
	}
	return nil
}
