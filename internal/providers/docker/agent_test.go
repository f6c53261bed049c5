package docker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestExecKillsSetsidLeftovers: a command's tree dies at its timeout, at
// its end (unless background processes are preserved) and when the
// caller gives up, setsid leftovers included: the agent finds them by
// the marker in their environment, which a new session keeps.
func TestExecKillsSetsidLeftovers(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxFor(t, 2*time.Minute)
	alive := func(pid string) bool {
		res := run(t, p, id, "kill -0 "+pid+" 2>/dev/null && ! grep -q '^State:.*Z' /proc/"+pid+"/status")
		return res.ExitCode == 0
	}
	pidOf := func(res providers.ExecResult) string {
		t.Helper()
		pid := strings.TrimSpace(string(res.Stdout))
		if pid == "" {
			t.Fatalf("no pid: %+v", res)
		}
		return pid
	}

	// Timed out.
	res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 & echo $!; sleep 300", Timeout: time.Second})
	if err != nil || !res.TimedOut || res.ExitCode != 125 {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	pid := pidOf(res)
	testkit.Eventually(t, "the timed-out command's setsid leftover to die", 20*time.Second, func() bool { return !alive(pid) })

	// Returned.
	pid = pidOf(run(t, p, id, "setsid sleep 300 >/dev/null 2>&1 & echo $!"))
	testkit.Eventually(t, "a returned command's setsid leftover to die", 20*time.Second, func() bool { return !alive(pid) })

	// Preserved.
	res, err = p.Exec(ctx, id, providers.ExecRequest{Command: "setsid sleep 300 >/dev/null 2>&1 & echo $!", Timeout: 10 * time.Second, PreserveBackground: true})
	if err != nil {
		t.Fatal(err)
	}
	pid = pidOf(res)
	if !alive(pid) {
		t.Fatal("a preserved background process was killed")
	}
}

// TestAgentProtocolMismatch: a sandbox whose agent speaks another
// protocol version is refused at create with an error naming both, and
// nothing is left behind.
func TestAgentProtocolMismatch(t *testing.T) {
	dockertest.Require(t)
	bin := testkit.Binary(t, "cmd/sandgate-agent", "sandgate-agent", "-X github.com/sandgate/sandgate/internal/agentwire.Version=99")
	p := newProvider(t, func(o *Options) { o.AgentBinary = bin })
	ctx := ctxFor(t, time.Minute)
	_, err := p.Create(ctx, providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, ReadyTimeout: 30 * time.Second})
	if err == nil {
		t.Fatal("a sandbox with a mismatched agent was created")
	}
	msg := err.Error()
	if !strings.Contains(msg, "protocol "+agentwire.Version) || !strings.Contains(msg, "speaks 99") {
		t.Fatalf("mismatch error does not name both versions: %v", err)
	}
	owned, err := p.List(ctx)
	if err != nil || len(owned) != 0 {
		t.Fatalf("left behind: %v %v", owned, err)
	}
}

// TestAgentCrashReason: an agent that dies saying why (here a SIGQUIT
// from inside the sandbox: the Go runtime's dump) leaves the sandbox in
// error with its last words in the reason.
func TestAgentCrashReason(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxFor(t, time.Minute)
	_, err := p.Exec(ctx, id, providers.ExecRequest{
		Command: `for d in /proc/[0-9]*; do grep -q serve $d/cmdline 2>/dev/null && [ "$(cat $d/comm)" = sandgate-agent ] && kill -QUIT ${d#/proc/}; done; sleep 5`,
		Timeout: 30 * time.Second,
	})
	if !errors.Is(err, providers.ErrConflict) {
		t.Fatalf("the exec that ended the agent: %v, want ErrConflict", err)
	}
	st, err := p.Status(ctx, id)
	why := p.StateReason(id)
	if err != nil || st != providers.StateError || !strings.Contains(why, "its last words: SIGQUIT: quit") {
		t.Fatalf("status %q %v, reason %q", st, err, why)
	}
	t.Logf("reason: %s", why)
}

// TestAgentUnrunnable: an agent binary the sandbox cannot run (here a
// script whose interpreter is missing; a dynamically linked build, or one
// of another architecture, fails the same way) fails the create at once,
// saying why, instead of retrying until the ready timeout; nothing is left
// behind.
func TestAgentUnrunnable(t *testing.T) {
	dockertest.Require(t)
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "sandgate-agent")
	if err := os.WriteFile(bin, []byte("#!/nonexistent/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, func(o *Options) { o.AgentBinary = bin })
	ctx := ctxFor(t, time.Minute)
	start := time.Now()
	_, err := p.Create(ctx, providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, ReadyTimeout: 45 * time.Second})
	took := time.Since(start)
	t.Logf("after %v: %v", took, err)
	if !errors.Is(err, providers.ErrUnavailable) || !strings.Contains(providers.Message(err), "cannot run sandgate's agent") ||
		!strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("create with an agent that cannot run: %v, want ErrUnavailable saying so, with the runtime's reason", err)
	}
	if took > 30*time.Second {
		t.Errorf("the create failed after %v: it waited for the ready timeout", took)
	}
	owned, err := p.List(ctx)
	if err != nil || len(owned) != 0 {
		t.Fatalf("left behind: %v %v", owned, err)
	}
}
