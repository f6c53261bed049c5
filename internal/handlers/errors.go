package handlers

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/sandgate/sandgate/internal/providers"
)

// problem is the application/problem+json body of every error (RFC 9457).
type problem struct {
	Type   string                 `json:"type"`
	Title  string                 `json:"title"`
	Status int                    `json:"status"`
	Detail string                 `json:"detail"`
	Code   string                 `json:"code"`
	Errors []providers.FieldError `json:"errors,omitempty"`
}

// kindStatus maps each error kind to its status and machine-readable code.
var kindStatus = map[error]struct {
	status int
	code   string
}{
	providers.ErrInvalid:      {http.StatusBadRequest, "invalid_input"},
	providers.ErrUnauthorized: {http.StatusUnauthorized, "unauthorized"},
	providers.ErrForbidden:    {http.StatusForbidden, "forbidden"},
	providers.ErrNotFound:     {http.StatusNotFound, "not_found"},
	providers.ErrConflict:     {http.StatusConflict, "conflict"},
	providers.ErrUnsupported:  {http.StatusConflict, "not_supported"},
	providers.ErrTooLarge:     {http.StatusRequestEntityTooLarge, "too_large"},
	providers.ErrTooMany:      {http.StatusTooManyRequests, "too_many_requests"},
	providers.ErrUnavailable:  {http.StatusServiceUnavailable, "unavailable"},
}

// statusClientClosed answers a request whose client is gone (nginx's 499;
// nobody reads it, but logs and metrics see it).
const statusClientClosed = 499

// retryAfter is the Retry-After (seconds) sent with every 503.
const retryAfter = "5"

// writeError renders err as problem+json with the status of its kind. An
// error of no kind is a bug: it is logged with its full chain and the
// client gets a safe message.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	writeProblem(w, problemOf(r.Context(), log, err, r.Method+" "+r.URL.Path))
}

// problemOf is err, from the request named what, as a problem (see
// writeError).
func problemOf(ctx context.Context, log *slog.Logger, err error, what string) problem {
	p := problem{Detail: providers.Message(err)}
	kind := providers.Kind(err)
	var mbe *http.MaxBytesError
	switch ks, ok := kindStatus[kind]; {
	case ctx.Err() != nil && errors.Is(err, ctx.Err()) && !ok:
		// The client went away (or gave up) before the answer: nobody
		// reads it, and it is no fault of the gateway's.
		p.Status, p.Code = statusClientClosed, "client_closed"
		log.Debug("client gone before the answer", "request", what, "err", err)
	case errors.As(err, &mbe):
		p.Status, p.Code = http.StatusRequestEntityTooLarge, "too_large"
		p.Detail = "request body too large"
	case ok:
		p.Status, p.Code = ks.status, ks.code
		if p.Status >= 500 {
			// The detail names what failed, not why (the cause may be
			// a backend's internals): the log keeps the why.
			log.Warn("request failed", "request", what, "request_id", middleware.GetReqID(ctx), "status", p.Status, "err", err)
		}
	default:
		p.Status, p.Code = http.StatusInternalServerError, "internal"
		id := middleware.GetReqID(ctx)
		p.Detail = "internal error; see the gateway log for request " + id
		log.Error("internal error", "request", what, "request_id", id, "err", err)
	}
	// Some errors carry the code the contract documents for them
	// (pty.Error: CONTEXT_NOT_FOUND, ALREADY_CONNECTED).
	var coded interface{ APICode() string }
	if p.Status < 500 && errors.As(err, &coded) {
		p.Code = coded.APICode()
	}
	var fields providers.InvalidFields
	if errors.As(err, &fields) {
		p.Errors = fields
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	return p
}

// writeProblem writes p, filling the fields derived from the status.
func writeProblem(w http.ResponseWriter, p problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if p.Type == "" {
		p.Type = "about:blank"
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.Status == http.StatusServiceUnavailable || p.Status == http.StatusTooManyRequests {
		h.Set("Retry-After", retryAfter)
	}
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(p)
}
