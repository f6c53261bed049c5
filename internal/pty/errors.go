package pty

import (
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/wire"
)

// API codes of the session errors that clients match on.
const (
	CodeContextNotFound  = "CONTEXT_NOT_FOUND"
	CodeAlreadyConnected = "ALREADY_CONNECTED"
)

// Error is an error of the session layer that carries the machine-readable
// code the API documents. It wraps a *providers.Error, whose kind picks
// the HTTP status and whose message is safe to show.
type Error struct {
	Code string
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// APICode is the problem's code (CONTEXT_NOT_FOUND, ALREADY_CONNECTED).
func (e *Error) APICode() string { return e.Code }

func errSessionNotFound(sid string) error {
	return &Error{Code: CodeContextNotFound, Err: providers.Errorf(providers.ErrNotFound, "no terminal session %q in this sandbox", wire.Truncate(sid, 64))}
}

func errAlreadyConnected(sid string) error {
	return &Error{Code: CodeAlreadyConnected, Err: providers.Errorf(providers.ErrConflict, "another client is attached to session %s; attach with takeover=1 to evict it", sid)}
}
