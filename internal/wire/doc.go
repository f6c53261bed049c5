// Package wire is the terminal attach protocol shared by its two ends, the
// gateway's terminal sessions (internal/pty) and their clients
// (internal/client): the frame codec (OpenSandbox execd compatible), the
// WebSocket close codes, and the retained output ring with absolute
// offsets. It depends on nothing of the gateway's.
package wire
