package wire

import "github.com/coder/websocket"

// The WebSocket close codes of the attach protocol, all in one place.
// Clients re-dial on every code but CloseTakenOver.
const (
	// CloseNormal: the process exited (sent after the exit frame).
	CloseNormal = websocket.StatusNormalClosure // 1000
	// CloseGoingAway: the gateway is shutting down, or the session was
	// deleted or its sandbox removed (after a SESSION_GONE error frame).
	CloseGoingAway = websocket.StatusGoingAway // 1001
	// ClosePolicy: the client could not keep up (its outgoing queue
	// filled) or was silent too long. It may re-attach with since.
	ClosePolicy = websocket.StatusPolicyViolation // 1008
	// CloseTakenOver: another client attached with takeover=1. A client
	// must not re-dial on it, or two clients would fight over the session.
	CloseTakenOver websocket.StatusCode = 4001
)
