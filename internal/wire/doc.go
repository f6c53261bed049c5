// Package wire is the terminal attach protocol shared by its two ends, the
// gateway's terminal sessions (internal/pty) and their clients
// (internal/client): the frame codec (OpenSandbox execd compatible) and the
// WebSocket close codes (the retained output ring is
// package ring). It depends on nothing of the gateway's.
package wire
