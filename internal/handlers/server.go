// Package handlers is the HTTP face of the sandbox service: it parses and
// validates requests against the OpenAPI contract, calls one service
// method, and renders the result or the error (problem+json, one mapping
// in errors.go). It knows nothing of any particular provider.
package handlers

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	apispec "github.com/sandgate/sandgate/api"
	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/web"
)

// Options configure the HTTP handler.
type Options struct {
	Service *sandbox.Service // required
	// PublicURL is the gateway's external base URL (scheme://host[:port]);
	// SandboxRef.server_url is PublicURL + "/v1".
	PublicURL string
	// MaxJSONBody caps JSON request bodies but the base64 upload's.
	// Default 1 MiB.
	MaxJSONBody int64
	// MaxUploadBody caps the base64 file routes: the upload's body and
	// the file a download returns. Default 64 MiB. The streaming file
	// routes have no cap.
	MaxUploadBody int64
	// MaxBodyInflight bounds the bytes of JSON request bodies buffered at
	// once, 1/4 of it for the requests of one API key; beyond it 503.
	// Default 256 MiB.
	MaxBodyInflight int64
	// BodyTimeout is how long a client may take to send a JSON body.
	// Default 120 s.
	BodyTimeout time.Duration
	// ReplyTimeout is how long an exec or base64 download reply may make
	// no write progress (the client takes nothing) before its connection
	// is closed and what it holds released. Default 60 s.
	ReplyTimeout time.Duration
	// Heartbeat is how often a reply that waits for a command (an exec,
	// a command's wait or its SSE output) writes something while there
	// is nothing to say, so that proxies that cut idle connections leave
	// it alone. Default 2 s.
	Heartbeat time.Duration
	// PTY serves the terminal sessions. The caller owns it and closes it
	// on shutdown (closing attached WebSockets with 1001). Nil: a manager
	// with default options that nobody closes (tests without sessions).
	PTY    *pty.Manager
	Logger *slog.Logger
	// Metrics records the HTTP metrics; Gatherer is what /metrics serves.
	// Both nil: no /metrics (tests without metrics).
	Metrics  *metrics.Metrics
	Gatherer prometheus.Gatherer
}

// New returns the gateway's HTTP handler.
func New(opts Options) (http.Handler, error) {
	if opts.MaxJSONBody <= 0 {
		opts.MaxJSONBody = DefaultMaxJSONBody
	}
	if opts.MaxUploadBody <= 0 {
		opts.MaxUploadBody = DefaultMaxUploadBody
	}
	if opts.MaxBodyInflight <= 0 {
		opts.MaxBodyInflight = DefaultMaxBodyInflight
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	if opts.ReplyTimeout <= 0 {
		opts.ReplyTimeout = DefaultReplyTimeout
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Metrics == nil {
		opts.Metrics = metrics.Discard()
	}
	base := strings.TrimSuffix(strings.TrimSuffix(opts.PublicURL, "/"), "/v1")
	if opts.PTY == nil {
		opts.PTY = pty.NewManager(opts.Service, pty.Options{Logger: opts.Logger, Metrics: opts.Metrics})
	}
	s := &server{svc: opts.Service, pty: opts.PTY, log: opts.Logger, met: opts.Metrics, serverURL: base + "/v1",
		maxJSON: opts.MaxJSONBody, maxUpload: opts.MaxUploadBody, bodies: newBodyBudget(opts.MaxBodyInflight),
		bodyTimeout: opts.BodyTimeout, replyTimeout: opts.ReplyTimeout, heartbeat: opts.Heartbeat}

	validate, err := s.validator()
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(middleware.RequestID, s.accessLog, s.recoverer, clearWriteDeadline)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem{Status: http.StatusNotFound, Code: "not_found", Detail: "no such route: " + r.Method + " " + r.URL.Path})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed", Detail: r.Method + " is not allowed on " + r.URL.Path})
	})

	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/readyz", s.readyz)
	if opts.Gatherer != nil {
		r.Handle("/metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	r.Get("/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(apispec.YAML)
	})
	page := web.Handler() // the browser terminal page and its assets
	r.Handle("/", page)
	r.Handle(web.AssetsPrefix+"*", page)

	strict := api.NewStrictHandlerWithOptions(s, []api.StrictMiddlewareFunc{askEvents}, api.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  s.requestError,
		ResponseErrorHandlerFunc: s.responseError,
	})
	r.Group(func(r chi.Router) {
		r.Use(s.credentials(credentialSources{}), s.authenticate, s.admitBody, validate)
		api.HandlerWithOptions(strict, api.ChiServerOptions{
			BaseRouter:       r,
			ErrorHandlerFunc: s.requestError,
		})
	})
	// The WebSocket attach and a command's output (raw or SSE),
	// documented in the contract, mounted by hand.
	wsValidate, err := s.wsValidator()
	if err != nil {
		return nil, err
	}
	r.Group(func(r chi.Router) {
		r.Use(s.credentials(credentialSources{query: true, subprotocol: true}), s.authenticate, wsValidate)
		r.Get("/v1/sandboxes/{id}/pty/{sid}/ws", s.attachPty)
	})
	r.Group(func(r chi.Router) {
		r.Use(s.credentials(credentialSources{}), s.authenticate, wsValidate)
		r.Get("/v1/sandboxes/{id}/commands/{cid}/output", s.readCommandOutput)
	})
	// The reverse proxy to sandbox ports: any method and body, streamed,
	// so neither validated against the contract nor size-capped.
	r.Group(func(r chi.Router) {
		r.Use(s.credentials(credentialSources{query: true}), s.authenticate)
		r.Handle("/v1/sandboxes/{id}/proxy/{port}/*", http.HandlerFunc(s.proxy))
	})
	return r, nil
}

// server implements api.StrictServerInterface.
type server struct {
	svc       *sandbox.Service
	pty       *pty.Manager
	log       *slog.Logger
	met       *metrics.Metrics
	serverURL string
	maxJSON   int64 // JSON bodies but the upload's
	maxUpload int64 // the base64 upload's body and download's file
	bodies    *bodyBudget

	bodyTimeout  time.Duration
	replyTimeout time.Duration
	heartbeat    time.Duration
}

// Defaults of Options.
const (
	DefaultMaxJSONBody     = 1 << 20
	DefaultMaxUploadBody   = 64 << 20
	DefaultMaxBodyInflight = 256 << 20
	DefaultBodyTimeout     = 120 * time.Second
	DefaultReplyTimeout    = 60 * time.Second
	DefaultHeartbeat       = 2 * time.Second
)

var _ api.StrictServerInterface = (*server)(nil)

type ctxKey int

const (
	callerKey ctxKey = iota
	apiKeyKey
)

// callerFrom returns the credentials the credentials middleware found
// (and authenticate verified).
func callerFrom(ctx context.Context) sandbox.Caller {
	c, _ := ctx.Value(callerKey).(sandbox.Caller)
	return c
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	if err := s.svc.Ready(ctx); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "provider": s.svc.ProviderName()})
}

// requestError renders errors the generated router and strict handler
// find while binding a request (bad path or query parameters, bad JSON).
func (s *server) requestError(w http.ResponseWriter, r *http.Request, err error) {
	writeProblem(w, problem{Status: http.StatusBadRequest, Code: "invalid_input", Detail: err.Error()})
}

// responseError renders an error a handler returned. If the response had
// already started (a stream broke), it can only be logged.
func (s *server) responseError(w http.ResponseWriter, r *http.Request, err error) {
	if started(w) {
		s.log.Warn("response failed after it started", "request_id", requestID(r), "err", err)
		return
	}
	writeError(w, r, s.log, err)
}

// started reports whether the response on w has sent its status.
func started(w http.ResponseWriter) bool {
	ww, ok := w.(middleware.WrapResponseWriter)
	return ok && ww.Status() != 0
}

func requestID(r *http.Request) string { return middleware.GetReqID(r.Context()) }

// accessLog logs one line per request, counts it in the metrics by route
// pattern (never the raw path, which holds ids) and status, and echoes the
// request id. The raw URL is not logged: its query may hold a lease.
func (s *server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w.Header().Set(middleware.RequestIDHeader, requestID(r))
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		next.ServeHTTP(ww, r)
		took := time.Since(start)
		route := chi.RouteContext(r.Context()).RoutePattern()
		if route == "" {
			route = "unmatched"
		}
		status := ww.Status()
		if status == 0 {
			status = http.StatusSwitchingProtocols // a hijacked WebSocket
		}
		s.met.HTTPRequests.WithLabelValues(route, strconv.Itoa(status)).Inc()
		if status == http.StatusRequestEntityTooLarge {
			s.met.Refused.WithLabelValues("body").Inc()
		}
		s.met.HTTPSeconds.WithLabelValues(route).Observe(took.Seconds())
		s.log.Info("request", "method", r.Method, "route", route, "status", status,
			"bytes", ww.BytesWritten(), "duration", took, "request_id", requestID(r))
	})
}

// recoverer turns a panic into a logged 500.
func (s *server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic", "request_id", requestID(r), "panic", v)
				writeProblem(w, problem{Status: http.StatusInternalServerError, Code: "internal", Detail: "internal error; see the gateway log for request " + requestID(r)})
			}
		}()
		next.ServeHTTP(w, r)
	})
}
