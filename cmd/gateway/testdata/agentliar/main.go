// Command agentliar is hostile code for the escape suite: run as root
// inside a docker sandbox, it takes over the agent's socket and answers
// the gateway's next connection as a replaced agent would: an honest
// hello, then a terminal replay of 256 MiB and a file streamed far past
// the size it announced.
//
//	agentliar takeover VERSION   listen on the agent's socket in place of the agent, serve in the background
//	agentliar kill -             SIGKILL the agent's daemon (its connection to the gateway dies with it)
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

const sock = "/dev/.sandgate-agent.sock"

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: agentliar takeover|serve VERSION")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "takeover":
		err = takeover()
	case "serve":
		err = serve(os.NewFile(3, "listener"), os.Args[2])
	case "kill":
		err = killAgent()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "agentliar:", err)
		os.Exit(1)
	}
}

// takeover binds a socket aside, renames it over the agent's (new
// connections reach the liar; the agent keeps the one it has) and
// leaves a background copy of itself serving it.
func takeover() error {
	tmp := sock + ".liar"
	os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return err
	}
	f, err := l.(*net.UnixListener).File()
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, sock); err != nil {
		return err
	}
	cmd := exec.Command("/proc/self/exe", "serve", os.Args[2])
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	fmt.Println("listening")
	return nil
}

// killAgent kills every "sandgate-agent serve" process.
func killAgent() error {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return err
	}
	killed := 0
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		argv := strings.Split(string(b), "\x00")
		if len(argv) > 1 && strings.HasSuffix(argv[0], "sandgate-agent") && argv[1] == "serve" {
			syscall.Kill(pid, syscall.SIGKILL)
			killed++
		}
	}
	if killed == 0 {
		return fmt.Errorf("no agent daemon found")
	}
	return nil
}

func serve(f *os.File, version string) error {
	l, err := net.FileListener(f)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go lie(c, version)
	}
}

func lie(c net.Conn, version string) {
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	ys, err := yamux.Server(c, cfg)
	if err != nil {
		return
	}
	defer ys.Close()
	for {
		st, err := ys.AcceptStream()
		if err != nil {
			return
		}
		go answer(st, version)
	}
}

type request struct {
	Op    string `json:"op"`
	Start *struct {
		ID string `json:"id"`
	} `json:"start"`
	Session string `json:"session"`
}

func answer(st net.Conn, version string) {
	defer st.Close()
	var h [4]byte
	if _, err := io.ReadFull(st, h[:]); err != nil {
		return
	}
	b := make([]byte, min(binary.BigEndian.Uint32(h[:]), 1<<20))
	if _, err := io.ReadFull(st, b); err != nil {
		return
	}
	var req request
	json.Unmarshal(b, &req)
	session := func(id string) map[string]any {
		return map[string]any{"id": id, "tty": true, "started": true, "running": true, "output_offset": 0, "created_at": time.Now()}
	}
	switch req.Op {
	case "hello":
		msg(st, map[string]any{"version": version, "agent": "agentliar"})
	case "session.start":
		if req.Start != nil {
			msg(st, map[string]any{"session": session(req.Start.ID)})
		}
	case "session.list":
		msg(st, map[string]any{})
	case "session.attach":
		msg(st, map[string]any{"session": session(req.Session)})
		var fh [5]byte
		fh[0] = 'R'
		binary.BigEndian.PutUint32(fh[1:], 256<<20)
		st.Write(fh[:])
		// All of it, as long as the gateway takes it.
		chunk := make([]byte, 64<<10)
		for range 4 << 10 {
			if _, err := st.Write(chunk); err != nil {
				return
			}
		}
		io.Copy(io.Discard, st)
	case "read":
		msg(st, map[string]any{"size": 1024})
		chunk := make([]byte, 64<<10)
		for range 32 << 10 { // 2 GiB
			if _, err := st.Write(chunk); err != nil {
				return
			}
		}
	default:
		msg(st, map[string]any{"error": "agentliar answers no " + req.Op, "kind": "invalid"})
	}
}

func msg(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	w.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
	w.Write(b)
}
