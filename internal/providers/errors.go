package providers

import (
	"errors"
	"fmt"
	"strings"
)

// The error kinds. Every error a provider or the sandbox service returns
// wraps exactly one of them (with %w, or through *Error); the HTTP layer maps
// a kind to a status in one place. An error that wraps none is a bug (500).
var (
	ErrInvalid      = errors.New("invalid input")     // 400
	ErrUnauthorized = errors.New("unauthorized")      // 401
	ErrForbidden    = errors.New("forbidden")         // 403
	ErrNotFound     = errors.New("not found")         // 404
	ErrConflict     = errors.New("conflict")          // 409: wrong state
	ErrTooLarge     = errors.New("too large")         // 413
	ErrTooMany      = errors.New("too many requests") // 429: a concurrency limit
	ErrUnavailable  = errors.New("unavailable")       // 503: backend down, capacity
	ErrUnsupported  = errors.New("not supported")     // 409: capability missing
)

// Error is an error of one kind with a message that is safe to show a
// client: it names no host path and no raw backend error. Cause, if set, is
// kept for the logs and for errors.Is/As.
type Error struct {
	Kind  error
	Msg   string
	Cause error
}

// Errorf returns an *Error of kind with a client-safe message.
func Errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error of kind with a client-safe message and a cause.
func Wrap(kind error, cause error, msg string) error {
	return &Error{Kind: kind, Msg: msg, Cause: cause}
}

func (e *Error) Error() string {
	if e.Cause != nil {
		return e.Msg + ": " + e.Cause.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Kind, e.Cause}
	}
	return []error{e.Kind}
}

// Kinds lists the error kinds in the order Kind checks them.
var Kinds = []error{ErrInvalid, ErrUnauthorized, ErrForbidden, ErrNotFound, ErrConflict, ErrTooLarge, ErrTooMany, ErrUnavailable, ErrUnsupported}

// Kind returns the kind err wraps, or nil for an error of no kind (a bug).
func Kind(err error) error {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	for _, k := range Kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}

// Message returns the client-safe message of err: the Msg of the outermost
// *Error, else the kind's own text.
func Message(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Msg
	}
	var f InvalidFields
	if errors.As(err, &f) {
		return f.Error()
	}
	if k := Kind(err); k != nil {
		return k.Error()
	}
	return "internal error"
}

// FieldError is one problem with one input field.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// InvalidFields is an ErrInvalid that lists every problem of one input at
// once, so a client can fix them all in one round.
type InvalidFields []FieldError

func (e InvalidFields) Error() string {
	var b strings.Builder
	for i, f := range e {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(f.Field + ": " + f.Message)
	}
	return b.String()
}

func (e InvalidFields) Unwrap() error { return ErrInvalid }

// Add records a problem with field.
func (e *InvalidFields) Add(field, format string, args ...any) {
	*e = append(*e, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Err returns e as an error, or nil when it holds no problem.
func (e InvalidFields) Err() error {
	if len(e) == 0 {
		return nil
	}
	return e
}
