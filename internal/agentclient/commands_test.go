package agentclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// cmdReq is a durable command request with a test's defaults.
func cmdReq(id, command string) CommandRequest {
	return CommandRequest{ID: id, Retain: time.Minute,
		ExecRequest: providers.ExecRequest{Command: command, Timeout: time.Minute, MaxOutput: 16 << 20}}
}

// readAll reads command id's output from the offsets given, following
// it when follow, and returns stdout, stderr and the command at the end.
func readAll(t *testing.T, c *Client, id string, since, sinceErr int64, follow bool) (string, string, Command) {
	t.Helper()
	var out, errOut bytes.Buffer
	next := [2]int64{since, sinceErr}
	cmd, err := c.ReadCommand(context.Background(), id, since, sinceErr, follow,
		func(Command) error { return nil },
		func(o Output) error {
			i, b := 0, &out
			if !o.Stdout {
				i, b = 1, &errOut
			}
			if o.Offset != next[i] {
				return fmt.Errorf("chunk at %d, want %d", o.Offset, next[i])
			}
			next[i] += int64(len(o.Data))
			b.Write(o.Data)
			return nil
		})
	if err != nil {
		t.Fatalf("read %s: %v", id, err)
	}
	return out.String(), errOut.String(), cmd
}

func TestCommandLifecycle(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	started, err := c.StartCommand(ctx, cmdReq("c1", "echo out; echo err >&2; exit 3"))
	if err != nil || started.ID != "c1" || started.Command != "echo out; echo err >&2; exit 3" {
		t.Fatalf("start: %+v %v", started, err)
	}
	end, err := c.WaitCommand(ctx, "c1", time.Minute)
	if err != nil || end.Running || end.ExitCode == nil || *end.ExitCode != 3 || end.FinishedAt == nil {
		t.Fatalf("wait: %+v %v", end, err)
	}
	if end.StdoutSize != 4 || end.StderrSize != 4 || end.Truncated {
		t.Fatalf("sizes: %+v", end)
	}
	if out, errOut, _ := readAll(t, c, "c1", 0, 0, false); out != "out\n" || errOut != "err\n" {
		t.Fatalf("output %q %q", out, errOut)
	}
	if out, errOut, _ := readAll(t, c, "c1", 2, 4, true); out != "t\n" || errOut != "" {
		t.Fatalf("output from 2/4: %q %q", out, errOut)
	}
	got, err := c.Command(ctx, "c1")
	if err != nil || *got.ExitCode != 3 {
		t.Fatalf("get: %+v %v", got, err)
	}
	list, err := c.Commands(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "c1" {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := c.DeleteCommand(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Command(ctx, "c1"); providers.Kind(err) != providers.ErrNotFound {
		t.Fatalf("deleted command: %v", err)
	}
}

// Output past what is kept in memory spills to disk and reads back whole;
// past the cap it is cut at exactly the cap.
func TestCommandOutputSpillsAndCaps(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	req := cmdReq("big", "seq 1 400000; seq 1 1000 >&2") // 2.7 MB of stdout
	if _, err := c.StartCommand(ctx, req); err != nil {
		t.Fatal(err)
	}
	out, errOut, end := readAll(t, c, "big", 0, 0, true)
	var want strings.Builder
	for i := 1; i <= 400000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if out != want.String() || end.StdoutSize != int64(want.Len()) || end.Truncated {
		t.Fatalf("stdout: %d bytes (size %d, truncated %v), want %d", len(out), end.StdoutSize, end.Truncated, want.Len())
	}
	if !strings.HasPrefix(errOut, "1\n2\n") || !strings.HasSuffix(errOut, "\n1000\n") {
		t.Fatalf("stderr: %q", errOut)
	}
	// A second read from the middle of the spilled part.
	mid := int64(want.Len() / 2)
	if out, _, _ := readAll(t, c, "big", mid, end.StderrSize, false); out != want.String()[mid:] {
		t.Fatalf("stdout from %d: %d bytes", mid, len(out))
	}

	req = cmdReq("capped", "seq 1 400000")
	req.MaxOutput = 300_000
	if _, err := c.StartCommand(ctx, req); err != nil {
		t.Fatal(err)
	}
	out, _, end = readAll(t, c, "capped", 0, 0, true)
	if out != want.String()[:300_000] || end.StdoutSize != 300_000 || !end.Truncated || *end.ExitCode != 0 {
		t.Fatalf("capped: %d bytes, %+v", len(out), end)
	}
}

// A follower gets each byte once, as the command writes, and the end.
func TestCommandFollow(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	if _, err := c.StartCommand(ctx, cmdReq("f", "for i in 1 2 3; do echo $i; echo e$i >&2; sleep 0.1; done; exit 7")); err != nil {
		t.Fatal(err)
	}
	out, errOut, end := readAll(t, c, "f", 0, 0, true)
	if out != "1\n2\n3\n" || errOut != "e1\ne2\ne3\n" || *end.ExitCode != 7 {
		t.Fatalf("follow: %q %q %+v", out, errOut, end)
	}
}

// A durable exec outlives its caller: cancelled once it runs, it goes on,
// and its result and output are there by id, from another connection.
// With KillOnDisconnect it dies with the call.
func TestDurableExecOutlivesItsCaller(t *testing.T) {
	srv, c := pair(t)
	for _, kill := range []bool{false, true} {
		id := fmt.Sprintf("exec-%v", kill)
		ctx, cancel := context.WithCancel(context.Background())
		req := providers.ExecRequest{Command: "sleep 0.5; echo done", Timeout: time.Minute, MaxOutput: 1 << 20,
			ID: id, Retain: time.Minute, KillOnDisconnect: kill, Started: cancel}
		if _, err := c.Exec(ctx, req); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled exec: %v", err)
		}
		c2 := testkit.DialPipe(t, serveOn(srv), func(b net.Conn) (*Client, error) { return Dial(context.Background(), b) })
		end, err := c2.WaitCommand(context.Background(), id, time.Minute)
		if err != nil || end.Running {
			t.Fatalf("wait %s: %+v %v", id, end, err)
		}
		out, _, _ := readAll(t, c2, id, 0, 0, false)
		switch {
		case !kill && (*end.ExitCode != 0 || out != "done\n"):
			t.Fatalf("durable exec: %+v %q", end, out)
		case kill && (*end.ExitCode != 128+int(syscall.SIGKILL) || out != ""):
			t.Fatalf("exec killed on disconnect: %+v %q", end, out)
		}
	}
}

func TestCommandTimeoutAndSignal(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	req := cmdReq("slow", "sleep 30")
	req.Timeout = 200 * time.Millisecond
	if _, err := c.StartCommand(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartCommand(ctx, cmdReq("term", "sleep 30")); err != nil {
		t.Fatal(err)
	}
	if still, err := c.WaitCommand(ctx, "term", 10*time.Millisecond); err != nil || !still.Running || still.ExitCode != nil {
		t.Fatalf("a wait that times out: %+v %v", still, err)
	}
	if err := c.SignalCommand(ctx, "term", int(syscall.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	for id, code := range map[string]int{"slow": 125, "term": 128 + int(syscall.SIGTERM)} {
		end, err := c.WaitCommand(ctx, id, time.Minute)
		if err != nil || end.Running || *end.ExitCode != code || end.TimedOut != (id == "slow") {
			t.Fatalf("%s: %+v %v", id, end, err)
		}
	}
}

func TestCommandBadInput(t *testing.T) {
	_, c := pair(t)
	ctx := context.Background()
	if _, err := c.StartCommand(ctx, cmdReq("", "true")); providers.Kind(err) != providers.ErrInvalid {
		t.Fatalf("no id: %v", err)
	}
	req := cmdReq("nouser", "true")
	req.User = "no-such-user-here"
	if _, err := c.StartCommand(ctx, req); providers.Kind(err) != providers.ErrInvalid {
		t.Fatalf("unknown user: %v", err)
	}
	req = cmdReq("nocwd", "true")
	req.Cwd = "/no/such/dir"
	if _, err := c.StartCommand(ctx, req); providers.Kind(err) != providers.ErrInvalid {
		t.Fatalf("missing cwd: %v", err)
	}
	if _, err := c.Command(ctx, "nocwd"); providers.Kind(err) != providers.ErrNotFound {
		t.Fatalf("a command that did not start is kept: %v", err)
	}
	if _, err := c.StartCommand(ctx, cmdReq("x", "echo hi")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartCommand(ctx, cmdReq("x", "true")); providers.Kind(err) != providers.ErrConflict {
		t.Fatalf("a second x: %v", err)
	}
	if _, err := c.WaitCommand(ctx, "x", time.Minute); err != nil {
		t.Fatal(err)
	}
	noop := func(Output) error { return nil }
	start := func(Command) error { return nil }
	for _, since := range [][2]int64{{4, 0}, {0, 1}, {-1, 0}} {
		if _, err := c.ReadCommand(ctx, "x", since[0], since[1], false, start, noop); providers.Kind(err) != providers.ErrInvalid {
			t.Fatalf("read from %v: %v", since, err)
		}
	}
	for _, sig := range []int{0, -1, 99} {
		if err := c.SignalCommand(ctx, "x", sig); providers.Kind(err) != providers.ErrInvalid {
			t.Fatalf("signal %d: %v", sig, err)
		}
	}
	for _, err := range []error{
		c.SignalCommand(ctx, "nope", 15), c.DeleteCommand(ctx, "nope"),
		func() error { _, err := c.WaitCommand(ctx, "nope", time.Second); return err }(),
		func() error { _, err := c.ReadCommand(ctx, "nope", 0, 0, true, start, noop); return err }(),
	} {
		if providers.Kind(err) != providers.ErrNotFound {
			t.Fatalf("unknown command: %v", err)
		}
	}
}
