package pty

import (
	"github.com/coder/websocket"

	"github.com/sandgate/sandgate/internal/wire"
)

// closeCause is why the server closes a connection: the code, a short
// static reason, and optionally the code of an error frame sent first. It
// is also the cancellation cause of the connection's context.
type closeCause struct {
	code     websocket.StatusCode
	reason   string
	errFrame string // "" = no error frame before the close
}

func (c *closeCause) Error() string { return c.reason }

var (
	causeExited    = &closeCause{code: wire.CloseNormal, reason: "process exited"}
	causeShutdown  = &closeCause{code: wire.CloseGoingAway, reason: "gateway shutting down"}
	causeGone      = &closeCause{code: wire.CloseGoingAway, reason: "session gone", errFrame: wire.CodeSessionGone}
	causeSlow      = &closeCause{code: wire.ClosePolicy, reason: "client too slow; re-attach with since"}
	causeSilent    = &closeCause{code: wire.ClosePolicy, reason: "client silent"}
	causeTakenOver = &closeCause{code: wire.CloseTakenOver, reason: "TAKEN_OVER"}
)
