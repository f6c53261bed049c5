package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestSIGTERMClosesWebSocketsWith1001: on SIGTERM the gateway closes an
// attached terminal client with 1001 before it exits (http.Server.Shutdown
// alone would not wait for the hijacked connection).
func TestSIGTERMClosesWebSocketsWith1001(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	post := func(path, tok, body string, out any) {
		t.Helper()
		req, _ := http.NewRequest("POST", g.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if tok != "" {
			req.Header.Set("X-Sandbox-Lease", tok)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		data, _ := io.ReadAll(res.Body)
		if res.StatusCode != 201 {
			t.Fatalf("%s: %d %s", path, res.StatusCode, data)
		}
		json.Unmarshal(data, out)
	}
	var ref struct {
		SandboxID string `json:"sandbox_id"`
		Token     string `json:"lease_token"`
	}
	post("/v1/sandboxes", "", "{}", &ref)
	var sess struct {
		SessionID string `json:"session_id"`
	}
	post("/v1/sandboxes/"+ref.SandboxID+"/pty", ref.Token, "{}", &sess)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u := "ws" + strings.TrimPrefix(g.URL, "http") + "/v1/sandboxes/" + ref.SandboxID + "/pty/" + sess.SessionID + "/ws?lease=" + ref.Token
	conn, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(-1)
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if typ == websocket.MessageText && strings.Contains(string(b), `"connected"`) {
			break
		}
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	for {
		_, _, err := conn.Read(ctx)
		if err != nil {
			if code := websocket.CloseStatus(err); code != websocket.StatusGoingAway {
				t.Fatalf("close %v (%v), want 1001\n%s", code, err, g.stderr)
			}
			break
		}
	}
	if err := g.stop(syscall.SIGTERM); err != nil {
		t.Fatalf("gateway exit: %v\n%s", err, g.stderr)
	}
}
