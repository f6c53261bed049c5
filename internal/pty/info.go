// Package pty serves terminal sessions over WebSockets (SPEC §7,
// OpenSandbox execd compatible): a process started in a sandbox with a
// PTY (or pipes) whose output is retained with absolute offsets, attached
// to by at most one client at a time, which can drop and come back to
// replay exactly what it missed.
//
// The sessions themselves live in each sandbox's session host (package
// agent: the sandbox's own agent, or one the gateway runs in process for
// a provider without), so they outlive the gateway. This package keeps
// the connections: the Manager (limits, holders, takeover, the attach
// protocol, the join point of every goroutine), the client (one
// WebSocket: a bounded outgoing queue, a writer, a pinger, a feeder from
// the host) and the close causes (close.go). The frame codec and close
// codes are package wire, which clients share.
package pty

import (
	"time"

	"github.com/sandgate/sandgate/internal/wire"
)

// touchEvery rate-limits the sandbox activity that output records.
const touchEvery = time.Second

// Info describes a session (GET /pty/{sid}).
type Info struct {
	ID           string
	Running      bool
	OutputOffset int64 // total output so far: the next byte's absolute offset
	ExitCode     *int  // nil while running
	Mode         wire.Mode
	Attached     bool
	CreatedAt    time.Time
}
