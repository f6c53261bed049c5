// Package e2b is the E2B face of the sandbox service: the wire the E2B
// SDKs speak, so that they work against sandgate with only their URLs and
// API key changed. It has two halves, both over the same sandbox.Service
// as package handlers:
//
//   - the control plane (E2B's REST API: create, get, list, kill, set
//     timeout, pause, connect), under Prefix+"/api": the SDKs' E2B_API_URL;
//   - the data plane (the in-sandbox daemon envd: its Connect-RPC services
//     process.Process and filesystem.Filesystem and its /files routes),
//     under Prefix+"/sandbox": the SDKs' E2B_SANDBOX_URL, one URL for every
//     sandbox, which the SDKs name in the E2b-Sandbox-Id header.
//
// The SDK's API key (X-API-Key) is a sandgate API key; the per-sandbox
// access token it receives (envdAccessToken, sent back as X-Access-Token)
// is a sandgate owner lease, so leases, quotas and ownership apply
// unchanged. A process started through E2B is a durable command of
// sandgate's (its tag is the command id), so it survives a gateway
// restart as those do.
package e2b

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/sandgate/sandgate/internal/e2b/envd/process/processconnect"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// EnvdVersion is the envd version the control plane reports for every
// sandbox. The SDKs gate features on it: 0.5.7 has the raw (octet-stream)
// upload and stdin control, and no user is sent unless the caller names
// one (the sandbox's default user runs what is not given a user).
const EnvdVersion = "0.5.7"

// maxRPCMessage caps a data-plane RPC message (a PTY's input is the
// largest the SDKs send); beyond it ResourceExhausted.
const maxRPCMessage = 4 << 20

// DefaultPrefix is where the E2B face is mounted by default.
const DefaultPrefix = "/e2b"

// Options configure the E2B face.
type Options struct {
	Service *sandbox.Service // required
	// Prefix is the path the face is mounted under (DefaultPrefix if
	// empty); the control plane is Prefix/api, the data plane
	// Prefix/sandbox.
	Prefix string
	// PTY serves PTY processes as terminal sessions (nil: PTY processes
	// are refused as not supported).
	PTY    *pty.Manager
	Logger *slog.Logger
}

// server serves both planes.
type server struct {
	svc *sandbox.Service
	pty *pty.Manager
	log *slog.Logger
}

// New returns the handler of the E2B face. Mount it at Prefix+"/" of the
// gateway's listener; it answers the paths under Prefix.
func New(opts Options) http.Handler {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	opts.Prefix = strings.TrimSuffix(opts.Prefix, "/")
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &server{svc: opts.Service, pty: opts.PTY, log: opts.Logger}

	api := http.NewServeMux()
	s.controlRoutes(api)

	data := http.NewServeMux()
	limit := connect.WithReadMaxBytes(maxRPCMessage)
	data.Handle(processconnect.NewProcessHandler(&processServer{s: s}, limit))
	data.Handle(filesystemconnect.NewFilesystemHandler(&filesystemServer{s: s}, limit))
	data.HandleFunc("GET /health", s.health)
	data.HandleFunc("GET /files", s.download)
	data.HandleFunc("POST /files", s.upload)

	mux := http.NewServeMux()
	mux.Handle(opts.Prefix+"/api/", http.StripPrefix(opts.Prefix+"/api", api))
	mux.Handle(opts.Prefix+"/sandbox/", http.StripPrefix(opts.Prefix+"/sandbox", data))
	mux.HandleFunc(opts.Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, providers.Errorf(providers.ErrNotFound, "no such route: %s %s (the E2B control plane is under %s/api, the data plane under %s/sandbox)", r.Method, r.URL.Path, opts.Prefix, opts.Prefix))
	})
	return s.accessLog(mux)
}

// accessLog logs one debug line per request: method, path (ids, never a
// credential: those travel in headers), status, duration and sandbox.
func (s *server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		s.log.Debug("e2b request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"sandbox", r.Header.Get("E2b-Sandbox-Id"), "took", time.Since(start))
	})
}

// statusWriter records the status of a response; it flushes (Connect's
// streams need it) and unwraps for http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// apiError is an error as E2B's API and envd's HTTP routes write it.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// statusOf maps an error kind to the HTTP status the E2B SDKs turn into
// their own exceptions (401 AuthenticationError, 404 NotFoundError, 429
// RateLimitError, 400 InvalidArgumentError on the data plane).
func statusOf(err error) int {
	var bad providers.InvalidFields
	if errors.As(err, &bad) {
		return http.StatusBadRequest
	}
	switch providers.Kind(err) {
	case providers.ErrInvalid:
		return http.StatusBadRequest
	case providers.ErrUnauthorized:
		return http.StatusUnauthorized
	case providers.ErrForbidden:
		return http.StatusForbidden
	case providers.ErrNotFound:
		return http.StatusNotFound
	case providers.ErrConflict, providers.ErrUnsupported:
		return http.StatusConflict
	case providers.ErrTooLarge:
		return http.StatusRequestEntityTooLarge
	case providers.ErrTooMany:
		return http.StatusTooManyRequests
	case providers.ErrUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// messageOf is err's client-safe message: the fields of an InvalidFields,
// the Msg of a kind, and nothing of an error of no kind (a bug, logged).
func messageOf(err error) string {
	var bad providers.InvalidFields
	if errors.As(err, &bad) {
		return bad.Error()
	}
	if providers.Kind(err) == nil {
		return "internal error"
	}
	return providers.Message(err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeAPIError(w http.ResponseWriter, err error) {
	st := statusOf(err)
	writeJSON(w, st, apiError{Code: st, Message: messageOf(err)})
}

// logged writes err, logging it first when it is of no kind (a bug).
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if providers.Kind(err) == nil {
		var bad providers.InvalidFields
		if !errors.As(err, &bad) {
			s.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		}
	}
	writeAPIError(w, err)
}

// connectErr is err as a Connect error, with the codes the E2B SDKs turn
// into their own exceptions (Unauthenticated AuthenticationError,
// NotFound NotFoundError, InvalidArgument InvalidArgumentError).
func (s *server) connectErr(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	var bad providers.InvalidFields
	code := connect.CodeInternal
	switch {
	case errors.As(err, &bad):
		code = connect.CodeInvalidArgument
	default:
		switch providers.Kind(err) {
		case providers.ErrInvalid:
			code = connect.CodeInvalidArgument
		case providers.ErrUnauthorized:
			code = connect.CodeUnauthenticated
		case providers.ErrForbidden:
			code = connect.CodePermissionDenied
		case providers.ErrNotFound:
			code = connect.CodeNotFound
		case providers.ErrConflict:
			code = connect.CodeFailedPrecondition
		case providers.ErrUnsupported:
			code = connect.CodeUnimplemented
		case providers.ErrTooLarge, providers.ErrTooMany:
			code = connect.CodeResourceExhausted
		case providers.ErrUnavailable:
			code = connect.CodeUnavailable
		default:
			s.log.Error("e2b rpc failed", "err", err)
		}
	}
	return connect.NewError(code, errors.New(messageOf(err)))
}

// unsupported is the Connect error of an RPC or option sandgate does not
// serve yet.
func unsupported(what string) error {
	return connect.NewError(connect.CodeUnimplemented, errors.New(what+" is not supported by sandgate's E2B face yet"))
}

// health answers envd's health check, which the SDKs use to tell a
// sandbox that is gone: 204 while the sandbox runs, 502 (as E2B's proxy
// answers for a sandbox that is no more) when it is unknown or not
// running.
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	t, err := s.target(r.Context(), r.Header)
	if err == nil {
		var info sandbox.Info
		if info, err = s.svc.Get(r.Context(), t.c, t.id); err == nil && info.State != providers.StateRunning {
			err = providers.Errorf(providers.ErrNotFound, "sandbox %s is %s", t.id, info.State)
		}
	}
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case providers.Kind(err) == providers.ErrNotFound:
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: messageOf(err)})
	default:
		s.writeError(w, r, err)
	}
}
