package handlers

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// A request is admitted in this order, before anything reads its body:
// credentials (found in the headers, and for the WebSocket attach and the
// proxy in the subprotocol or ?lease=), authenticate (verified by the
// service: 401, 403 or 404 answered here), admitBody (the route's body
// cap, 413, and the gateway's room for buffered bodies, 503), then the
// contract's validator, which reads and decodes the body.

// LeaseHeaders are the request headers that carry a lease token, in the
// order they are consulted.
var LeaseHeaders = []string{"X-NeMo-Gym-Sandbox-Lease", "X-Sandbox-Lease"}

// leaseSubprotocol prefixes the WebSocket subprotocol that carries a lease
// token for browsers, which cannot set headers on a WebSocket.
const leaseSubprotocol = "sandgate.lease."

// credentialSources says where besides the headers a route's lease may come.
type credentialSources struct {
	query       bool // ?lease= (the WebSocket attach, the proxy)
	subprotocol bool // Sec-WebSocket-Protocol sandgate.lease.<token> (the attach)
}

// credentials puts the request's credentials into its context: a lease
// header first, then the subprotocol and ?lease= where src allows them;
// an Authorization bearer apart.
func (s *server) credentials(src credentialSources) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var c sandbox.Caller
			for _, h := range LeaseHeaders {
				if v := strings.TrimSpace(r.Header.Get(h)); v != "" {
					c.Lease = v
					break
				}
			}
			if c.Lease == "" && src.subprotocol {
				c.Lease = strings.TrimPrefix(leaseProtocol(r), leaseSubprotocol)
			}
			if c.Lease == "" && src.query {
				c.Lease = r.URL.Query().Get("lease")
			}
			if auth := r.Header.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
				c.Bearer = strings.TrimSpace(auth[7:])
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey, c)))
		})
	}
}

// leaseProtocol is the first sandgate.lease.<token> subprotocol r offers,
// or "".
func leaseProtocol(r *http.Request) string {
	for _, p := range strings.Split(r.Header.Get("Sec-WebSocket-Protocol"), ",") {
		if p = strings.TrimSpace(p); strings.HasPrefix(p, leaseSubprotocol) {
			return p
		}
	}
	return ""
}

// authenticate verifies the request's credentials with the service (see
// sandbox.Service.Authenticate) before anything reads its body, and puts
// the verified caller and the API key the request counts against into
// its context.
func (s *server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, key, err := s.svc.Authenticate(r.Context(), callerFrom(r.Context()), chi.URLParam(r, "id"))
		if err != nil {
			s.refuseUnread(w, r, err)
			return
		}
		ctx := context.WithValue(r.Context(), callerKey, c)
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, apiKeyKey, key)))
	})
}

// refuseUnread answers err to a request whose body, if it has one, is
// not (all) read, and closes the connection after the answer: otherwise
// the server would read up to 256 KiB of a body of unknown length before
// answering, waiting for a client that may never send it.
func (s *server) refuseUnread(w http.ResponseWriter, r *http.Request, err error) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
	writeError(w, r, s.log, err)
}

// apiKeyFrom is the fingerprint of the API key the request counts against
// ("" = anonymous), as authenticate found it.
func apiKeyFrom(ctx context.Context) string {
	k, _ := ctx.Value(apiKeyKey).(string)
	return k
}

// isStream reports whether r is the streaming upload, whose body is not
// JSON, has no size cap and is never buffered.
func isStream(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/files")
}

// isUpload reports whether r is the base64 upload, whose body may be as
// large as a file the JSON routes carry.
func isUpload(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/upload")
}

var (
	errBodiesBusy = providers.Errorf(providers.ErrUnavailable,
		"the gateway is receiving as many request bodies as it holds at once; retry shortly")
	errKeyBodiesBusy = providers.Errorf(providers.ErrUnavailable,
		"this API key's requests are sending as many bodies as one key may hold at once; retry shortly")
)

// admitBody caps a buffered (JSON) body, the base64 upload's at maxUpload
// and every other at maxJSON, answering 413 before reading one whose
// Content-Length is over; takes its room in the gateway's body budget
// (answering 503 when there is none: before reading when the length is
// known, else as it is read); and gives the client bodyTimeout to send
// it. The streaming upload passes untouched.
func (s *server) admitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || isStream(r) {
			next.ServeHTTP(w, r)
			return
		}
		limit := s.maxJSON
		if isUpload(r) {
			limit = s.maxUpload
		}
		if r.ContentLength > limit {
			hint := ""
			if isUpload(r) {
				hint = "; send large files as raw bytes to PUT /v1/sandboxes/{id}/files?path=… (curl -T FILE), which streams any size"
			}
			s.refuseUnread(w, r, providers.Errorf(providers.ErrTooLarge,
				"request body too large: %d bytes, this route takes at most %d%s", r.ContentLength, limit, hint))
			return
		}
		body := &admittedBody{rc: r.Body, b: s.bodies, key: apiKeyFrom(r.Context()), ctl: http.NewResponseController(w)}
		if r.ContentLength > 0 {
			if err := s.bodies.take(body.key, r.ContentLength); err != nil {
				s.refuseUnread(w, r, err)
				return
			}
			body.held, body.prepaid = r.ContentLength, true
		}
		defer body.release()
		// Until the body is in: a client that sends nothing holds no
		// handler for longer (cleared at its end, or an exec running
		// past it would be cancelled by the server's background read).
		body.ctl.SetReadDeadline(time.Now().Add(s.bodyTimeout))
		r.Body = http.MaxBytesReader(w, body, limit)
		next.ServeHTTP(w, r)
	})
}

// admittedBody is a request body counted in a bodyBudget until release:
// all of it up front when its length was known (prepaid), else as it is
// read. Read and release are called by the request's goroutine only.
type admittedBody struct {
	rc      io.ReadCloser
	b       *bodyBudget
	key     string
	ctl     *http.ResponseController
	held    int64
	prepaid bool
	done    bool // read to its end: the read deadline is cleared
}

func (a *admittedBody) Read(p []byte) (int, error) {
	n, err := a.rc.Read(p)
	if n > 0 && !a.prepaid {
		if berr := a.b.take(a.key, int64(n)); berr != nil {
			return 0, berr
		}
		a.held += int64(n)
	}
	if err == io.EOF && !a.done {
		a.done = true
		a.ctl.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (a *admittedBody) Close() error { return a.rc.Close() }

func (a *admittedBody) release() {
	a.b.give(a.key, a.held)
	a.held = 0
}

// bodyBudget bounds the bytes of request bodies the gateway buffers at
// once (JSON bodies are read whole before a handler runs): total in all,
// perKey for the requests of one API key, so that one key's bodies never
// take all the room.
type bodyBudget struct {
	mu     sync.Mutex // guards used and byKey
	total  int64
	perKey int64
	used   int64
	byKey  map[string]int64
}

func newBodyBudget(total int64) *bodyBudget {
	return &bodyBudget{total: total, perKey: max(total/bodyKeyShare, 1), byKey: map[string]int64{}}
}

// bodyKeyShare: one key may hold 1/bodyKeyShare of the body budget.
const bodyKeyShare = 4

// take counts n more bytes for key, or returns errBodiesBusy or
// errKeyBodiesBusy (503) and counts nothing.
func (b *bodyBudget) take(key string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.byKey[key]+n > b.perKey:
		return errKeyBodiesBusy
	case b.used+n > b.total:
		return errBodiesBusy
	}
	b.used += n
	b.byKey[key] += n
	return nil
}

// give returns n bytes of key's.
func (b *bodyBudget) give(key string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.byKey[key] -= n; b.byKey[key] <= 0 {
		delete(b.byKey, key)
	}
}

// inUse returns the bytes counted now, in all and for key.
func (b *bodyBudget) inUse(key string) (all, ofKey int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.byKey[key]
}

// isBodyBusy reports whether err is a body budget's refusal.
func isBodyBusy(err error) bool {
	return errors.Is(err, errBodiesBusy) || errors.Is(err, errKeyBodiesBusy)
}

// clearWriteDeadline lifts a write deadline an earlier reply on the same
// connection left (see progressWriter) before the next request is served.
func clearWriteDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).SetWriteDeadline(time.Time{})
		next.ServeHTTP(w, r)
	})
}

// progressWriter writes a reply with a write deadline of d from each
// write: a client that takes nothing of it for d gets its connection
// closed (the write fails), so what the reply holds is let go.
type progressWriter struct {
	w   io.Writer
	ctl *http.ResponseController
	d   time.Duration
}

func newProgressWriter(w http.ResponseWriter, d time.Duration) *progressWriter {
	return &progressWriter{w: w, ctl: http.NewResponseController(w), d: d}
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.ctl.SetWriteDeadline(time.Now().Add(p.d))
	return p.w.Write(b)
}

// flush pushes what the response buffers onto the connection under the
// same deadline, so the reply is out (or cut) when the visitor returns.
func (p *progressWriter) flush() error {
	p.ctl.SetWriteDeadline(time.Now().Add(p.d))
	return p.ctl.Flush()
}
