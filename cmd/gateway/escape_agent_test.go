package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestEscapeDockerAgentLiar: root inside a docker sandbox replaces the
// sandbox's agent with one that lies (testdata/agentliar): 4 terminal
// attaches whose replays it announces at 256 MiB, and a base64 download
// it streams far past the size it announced. The gateway's memory stays
// bounded (4 such attaches took it from 63 MiB to 1.4 GiB, the download
// streamed 1.96 GB through a 64 MiB cap), each liar's sandbox reads
// error with the violation as its reason, and another sandbox is served
// as before.
func TestEscapeDockerAgentLiar(t *testing.T) {
	t.Parallel()
	g := startDockerGateway(t, t.TempDir())
	liarBin, err := os.ReadFile(testkit.Binary(t, "cmd/gateway/testdata/agentliar", "agentliar", ""))
	if err != nil {
		t.Fatal(err)
	}
	honest, replayLiar, fileLiar := dkCreate(t, g, ""), dkCreate(t, g, ""), dkCreate(t, g, "")

	for _, sb := range []dkBox{replayLiar, fileLiar} {
		s, b := call(t, "PUT", sb.url+"/files?path=/tmp/agentliar", string(liarBin),
			"X-Sandbox-Lease", sb.token, "Content-Type", "application/octet-stream")
		if s != 200 {
			t.Fatalf("upload the liar: %d %s", s, b)
		}
		// The liar serves in the background (the agent would kill it with
		// the exec otherwise). The agent still serves the gateway's
		// connection: kill it (that exec dies with it), and the gateway's
		// next connection reaches the liar.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		s, res, err := dkExec(ctx, sb, "chmod +x /tmp/agentliar && /tmp/agentliar takeover "+agentwire.Version, true)
		if err != nil || s != 200 || res.Stdout != "listening\n" {
			t.Fatalf("takeover: %d %v %v", s, res, err)
		}
		dkExec(ctx, sb, "/tmp/agentliar kill -", false)
		cancel()
	}

	// The terminal liar: 4 sessions (it answers their start), then 4
	// attaches at once, each told of a 256 MiB replay.
	var sessions []string
	for range 4 {
		var sess struct {
			ID string `json:"session_id"`
		}
		var last string
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the last session create answered %s", last)
			}
		})
		testkit.Eventually(t, "a session started through the liar", time.Minute, func() bool {
			s, b := call(t, "POST", replayLiar.url+"/pty", "{}", "X-Sandbox-Lease", replayLiar.token)
			last = fmt.Sprintf("%d %s", s, b)
			return s == 201 && json.Unmarshal(b, &sess) == nil && sess.ID != ""
		})
		sessions = append(sessions, sess.ID)
	}
	// The peak from here on: 5 resets the process's VmHWM to its RSS.
	if err := os.WriteFile(filepath.Join("/proc", strconv.Itoa(g.cmd.Process.Pid), "clear_refs"), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	rss0 := procRSS(t, g.cmd.Process.Pid)
	var wg sync.WaitGroup
	for _, sid := range sessions {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			u := "ws" + strings.TrimPrefix(replayLiar.url, "http") + "/pty/" + sid + "/ws?lease=" + replayLiar.token
			conn, _, err := websocket.Dial(ctx, u, nil)
			if err != nil {
				return // refused before the upgrade
			}
			defer conn.CloseNow()
			for {
				if _, _, err := conn.Read(ctx); err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	peak := peakRSS(t, g.cmd.Process.Pid)
	t.Logf("gateway RSS %d MiB before 4 lying attaches, peak %d MiB", rss0>>20, peak>>20)
	if peak > rss0+128<<20 {
		t.Fatalf("4 attaches announcing 256 MiB replays took the gateway from %d MiB to a peak of %d MiB", rss0>>20, peak>>20)
	}
	sandboxInError(t, replayLiar, "agent protocol violation: replay length 268435456 over 1048576")

	// The file liar: a download it announces at 1 KiB and streams 2 GiB.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", fileLiar.url+"/download?remote_path=/tmp/x", nil)
	req.Header.Set("X-Sandbox-Lease", fileLiar.token)
	var got int64
	testkit.Eventually(t, "the download reaching the liar", time.Minute, func() bool {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		got, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 128<<20))
		return res.StatusCode != http.StatusServiceUnavailable // a reconnect in progress answers "try again"
	})
	if got > 4<<10 {
		t.Fatalf("the download of a file announced at 1 KiB gave %d bytes", got)
	}
	sandboxInError(t, fileLiar, "agent protocol violation: a file stream longer than the 1024 bytes announced")

	if out := dkRun(t, honest, "echo still served"); out != "still served\n" {
		t.Fatalf("the honest sandbox: %q", out)
	}
}

// sandboxInError waits until sb reads error with reason.
func sandboxInError(t *testing.T, sb dkBox, reason string) {
	t.Helper()
	var info struct {
		Status string `json:"status"`
		Reason string `json:"status_reason"`
	}
	testkit.EventuallyNil(t, "sandbox "+sb.id+" to read error", time.Minute, func() error {
		s, b := call(t, "GET", sb.url, "", "X-Sandbox-Lease", sb.token)
		if s == 200 && json.Unmarshal(b, &info) == nil && info.Status == "error" {
			return nil
		}
		return fmt.Errorf("%d %s", s, b)
	})
	if info.Reason != reason {
		t.Fatalf("sandbox %s in error because %q, want %q", sb.id, info.Reason, reason)
	}
}
