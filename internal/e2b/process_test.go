package e2b

import (
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/e2b/envd/process"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestStdinReadyAtStart: a process started with stdin takes input and a
// close of its stdin as soon as the client has its pid. The start event
// went out before the attach that starts the process, so a CloseStdin
// sent at once found the session not started and was refused ("a PTY has
// no stdin to close"; the E2B SDK's test saw it on a loaded machine), and
// an input sent at once started it in a PTY. Here the attach is held back
// (up to a bound, so that the fixed order does not wait for the test).
func TestStdinReadyAtStart(t *testing.T) {
	f := newFaceWith(t, true)
	ctx := testkit.Context(t, time.Minute)
	ref, err := f.svc.Create(ctx, sandbox.Caller{Bearer: testKey}, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	proc, _ := f.dataPlane(map[string]string{"E2b-Sandbox-Id": ref.SandboxID, "X-Access-Token": ref.Token})

	inputDone := make(chan struct{})
	testHookBeforeStart = func() {
		select {
		case <-inputDone:
		case <-time.After(500 * time.Millisecond):
		}
	}
	t.Cleanup(func() { testHookBeforeStart = nil })

	yes := true
	st, err := proc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "cat"}, Stdin: &yes}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v %v", st.Msg(), st.Err())
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	_, inErr := proc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel, Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("hi\n")}}}))
	_, closeErr := proc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel}))
	close(inputDone)
	if inErr != nil || closeErr != nil {
		t.Fatalf("right after the start event: SendInput %v, CloseStdin %v", inErr, closeErr)
	}
	var out, pty []byte
	var end *process.ProcessEvent_EndEvent
	for end == nil && st.Receive() {
		ev := st.Msg().GetEvent()
		out = append(out, ev.GetData().GetStdout()...)
		pty = append(pty, ev.GetData().GetPty()...)
		end = ev.GetEnd()
	}
	if end == nil || end.GetExitCode() != 0 || string(out) != "hi\n" || len(pty) != 0 {
		t.Fatalf("stdout %q, pty %q, end %v (%v): want cat's echo on stdout and exit 0", out, pty, end, st.Err())
	}
}
