package handlers

import (
	"encoding/base64"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/internal/providers"
)

// proxy forwards any request under /v1/sandboxes/{id}/proxy/{port}/ to
// that port of the sandbox (HTTP and WebSocket), after the same lease
// check as every per-sandbox route. The gateway's own credentials never
// reach the sandbox (see stripCredentials). The gateway sets no cookie,
// so there is none of its own to strip.
func (s *server) proxy(w http.ResponseWriter, r *http.Request) {
	id, portArg := chi.URLParam(r, "id"), chi.URLParam(r, "port")
	port, err := strconv.Atoi(portArg)
	if err != nil || port < 1 || port > 65535 {
		writeError(w, r, s.log, providers.InvalidFields{{Field: "path.port", Message: "must be an integer in 1..65535"}})
		return
	}
	ep, err := s.svc.Endpoint(r.Context(), callerFrom(r.Context()), id, port)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	target, err := url.Parse(ep.URL)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	s.svc.Touch(id)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = "/" + chi.URLParam(r, "*")
			pr.Out.URL.RawPath = ""
			pr.Out.URL.RawQuery = withoutParam(r.URL.RawQuery, "lease")
			s.stripCredentials(pr.Out.Header)
			for k, v := range ep.Headers {
				pr.Out.Header.Set(k, v)
			}
			pr.SetXForwarded()
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			s.log.Debug("proxy: upstream failed", "sandbox", id, "port", port, "err", err)
			writeProblem(w, problem{Status: http.StatusBadGateway, Code: "bad_gateway",
				Detail: "nothing answered on port " + portArg + " of sandbox " + id})
		},
	}
	rp.ServeHTTP(w, r)
}

// stripCredentials removes from h, headers bound for a sandbox, every
// credential of this gateway: the lease headers, the lease subprotocols
// of a WebSocket, and each Authorization value that carries an API key or
// a lease token of this gateway (live or not, whether or not it was the
// credential this request used; see carriesCredential). Any other
// Authorization (the application's own) passes.
func (s *server) stripCredentials(h http.Header) {
	for _, name := range LeaseHeaders {
		h.Del(name)
	}
	keep := h["Authorization"][:0]
	for _, v := range h["Authorization"] {
		if !s.carriesCredential(v) {
			keep = append(keep, v)
		}
	}
	if len(keep) == 0 {
		h.Del("Authorization")
	} else {
		h["Authorization"] = keep
	}
	if protos := h.Values("Sec-WebSocket-Protocol"); len(protos) > 0 {
		var kept []string
		for _, line := range protos {
			for _, p := range strings.Split(line, ",") {
				if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, leaseSubprotocol) {
					kept = append(kept, p)
				}
			}
		}
		h.Del("Sec-WebSocket-Protocol")
		if len(kept) > 0 {
			h.Set("Sec-WebSocket-Protocol", strings.Join(kept, ", "))
		}
	}
}

// carriesCredential reports whether an Authorization value holds a
// credential of this gateway: as its whole value, after a scheme (Bearer,
// Token, ...), or as the user or password of Basic.
func (s *server) carriesCredential(v string) bool {
	v = strings.TrimSpace(v)
	if s.svc.IsCredential(v) {
		return true
	}
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok {
		return false
	}
	if cred = strings.TrimSpace(cred); s.svc.IsCredential(cred) {
		return true
	}
	if strings.EqualFold(scheme, "basic") {
		if raw, err := base64.StdEncoding.DecodeString(cred); err == nil {
			user, pass, _ := strings.Cut(string(raw), ":")
			return s.svc.IsCredential(user) || s.svc.IsCredential(pass)
		}
	}
	return false
}

// withoutParam drops every name=... pair from a raw query, keeping the
// others as they were sent.
func withoutParam(raw, name string) string {
	if raw == "" {
		return ""
	}
	kept := make([]string, 0, 4)
	for _, kv := range strings.Split(raw, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if k, err := url.QueryUnescape(k); err == nil && k == name {
			continue
		}
		kept = append(kept, kv)
	}
	return strings.Join(kept, "&")
}
