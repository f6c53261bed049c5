package agentclient

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandgate/sandgate/internal/agentwire"
	"github.com/sandgate/sandgate/internal/providers"
)

// TestExecGivesUpOnAMuteAgent: an agent that never answers an exec (a
// sandbox starving it, or one that replaced it) is given up on
// answerGrace after the command's timeout, not before and not never,
// with ErrUnavailable; giving up cancels that command only and the
// connection stays good. In fake time (testing/synctest), so the real
// 30 s grace is what is tested.
func TestExecGivesUpOnAMuteAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := dialLiar(t, func(req agentwire.Request, st net.Conn) {
			if req.Op != agentwire.OpExec {
				return
			}
			agentwire.WriteMsg(st, agentwire.Reply{})
			if req.Exec.Command == "mute" {
				io.Copy(io.Discard, st) // until the gateway gives up
				return
			}
			agentwire.WriteFrame(st, agentwire.FrameResult, []byte(`{"exit_code":0}`))
		})
		start := time.Now()
		_, err := c.Exec(context.Background(), providers.ExecRequest{Command: "mute", Timeout: time.Minute})
		if !errors.Is(err, providers.ErrUnavailable) || !strings.Contains(err.Error(), "no result") {
			t.Fatalf("an agent that never answers: %v", err)
		}
		if waited := time.Since(start); waited != time.Minute+answerGrace {
			t.Errorf("gave up after %v, want the timeout plus %v", waited, answerGrace)
		}
		res, err := c.Exec(context.Background(), providers.ExecRequest{Command: "true", Timeout: time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec after a mute one: %+v %v", res, err)
		}
	})
}
