package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The durable commands end to end on the local provider, in a real
// gateway process, with the durations scaled down (a 200 ms heartbeat
// for the default 2 s).
const e2eBeat = 200 * time.Millisecond

// TestDurableExecLocal: durableExec on the local provider.
func TestDurableExecLocal(t *testing.T) {
	durableExec(t, func(state string) *proc {
		return startGateway(t, state, nil, "--heartbeat", e2eBeat.String())
	}, newLocalSandbox)
}

// TestDurableExecDocker: durableExec on the docker provider.
func TestDurableExecDocker(t *testing.T) {
	durableExec(t, func(state string) *proc {
		return startDockerGateway(t, state, "--heartbeat", e2eBeat.String())
	}, func(t *testing.T, g *proc) (string, string) {
		b := dkCreate(t, g, "")
		return b.id, b.token
	})
}

// TestDurableExecKubernetes: durableExec on the kubernetes provider; the
// gateway started after the SIGKILL is another replica (the same
// instance and lease secret, a state dir of its own).
func TestDurableExecKubernetes(t *testing.T) {
	k8stest.Require(t)
	instance, secret := "k8scmd-"+strings.ToLower(rand.Text()[:8]), rand.Text()
	durableExec(t, func(string) *proc {
		return startK8sGateway(t, t.TempDir(), instance, secret, "--heartbeat", e2eBeat.String())
	}, func(t *testing.T, g *proc) (string, string) {
		b := k8sCreate(t, g)
		return b.id, b.token
	})
}

// durableExec: through a proxy that cuts connections idle for 3
// heartbeats, an exec quiet for 5 gets its whole result; a client that
// gives up mid-exec leaves the command running, and its result and
// output are fetched by the X-Command-Id it got; a gateway SIGKILLed while
// a command runs is restarted (by start, on the same state dir) and
// serves that command's exact result.
func durableExec(t *testing.T, start func(state string) *proc, create func(*testing.T, *proc) (id, tok string)) {
	state := t.TempDir()
	g := start(state)
	id, tok := create(t, g)
	lease := []string{"X-Sandbox-Lease", tok}

	px := testkit.NewIdleProxy(t, "tcp", strings.TrimPrefix(g.URL, "http://"), 3*e2eBeat)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	status, res, err := execJSON(ctx, "http://"+px.Addr(), id, tok, "sleep 1; echo quiet done; exit 3")
	if err != nil || status != 200 || res.Stdout != "quiet done\n" || res.ReturnCode != 3 {
		t.Fatalf("quiet exec through the idle-cutting proxy: %d %+v %v (idle cuts %d)", status, res, err, px.IdleCuts())
	}

	// The client gives up once the command runs.
	gone, give := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(gone, "POST", g.URL+"/v1/sandboxes/"+id+"/exec",
		strings.NewReader(`{"command": "echo started; sleep 1; echo done > marker; echo finished; exit 4"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Sandbox-Lease", tok)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cid := r.Header.Get("X-Command-Id")
	give()
	r.Body.Close()
	if !strings.HasPrefix(cid, "cmd-") {
		t.Fatalf("X-Command-Id %q", cid)
	}
	code, body := call(t, "GET", g.URL+"/v1/sandboxes/"+id+"/commands/"+cid+"/wait?timeout_s=60", "", lease...)
	var fin execReply
	if err := json.Unmarshal(body, &fin); err != nil || code != 200 || fin.Stdout != "started\nfinished\n" || fin.ReturnCode != 4 {
		t.Fatalf("result of the abandoned exec: %d %s", code, body)
	}
	if code, body := call(t, "GET", g.URL+"/v1/sandboxes/"+id+"/files?path=marker", "", lease...); code != 200 || string(body) != "done\n" {
		t.Fatalf("marker of the abandoned exec: %d %q", code, body)
	}
	if code, body := call(t, "GET", g.URL+"/v1/sandboxes/"+id+"/commands/"+cid+"/output", "", lease...); code != 200 || string(body) != "started\nfinished\n" {
		t.Fatalf("output of the abandoned exec: %d %q", code, body)
	}

	// A durable command outlives its gateway.
	code, body = call(t, "POST", g.URL+"/v1/sandboxes/"+id+"/commands", `{"command": "sleep 1; echo survived; exit 6"}`, lease...)
	var c struct {
		ID string `json:"command_id"`
	}
	if err := json.Unmarshal(body, &c); err != nil || code != 201 {
		t.Fatalf("start: %d %s", code, body)
	}
	g.stop(syscall.SIGKILL)
	g2 := start(state)
	code, body = call(t, "GET", g2.URL+"/v1/sandboxes/"+id+"/commands/"+c.ID+"/wait?timeout_s=60", "", lease...)
	if err := json.Unmarshal(body, &fin); err != nil || code != 200 || fin.Stdout != "survived\n" || fin.ReturnCode != 6 {
		t.Fatalf("result after a gateway SIGKILL: %d %s\n%s", code, body, g2.stderr)
	}
}
