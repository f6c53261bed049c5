package handlers

import (
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
// check as every per-sandbox route. The gateway's own credentials are
// stripped first: the sandbox never sees a lease or an API key.
func (s *server) proxy(w http.ResponseWriter, r *http.Request) {
	id, portArg := chi.URLParam(r, "id"), chi.URLParam(r, "port")
	port, err := strconv.Atoi(portArg)
	if err != nil || port < 1 || port > 65535 {
		writeError(w, r, s.log, providers.InvalidFields{{Field: "path.port", Message: "must be an integer in 1..65535"}})
		return
	}
	c := callerFrom(r.Context())
	queryLease := r.URL.Query().Get("lease")
	if c.Lease == "" && queryLease != "" {
		c.Lease = queryLease
	}
	ep, err := s.svc.Endpoint(r.Context(), c, id, port)
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
	bearerUsed := callerFrom(r.Context()).Lease == "" && queryLease == ""
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = "/" + chi.URLParam(r, "*")
			pr.Out.URL.RawPath = ""
			pr.Out.URL.RawQuery = withoutParam(r.URL.RawQuery, "lease")
			for _, h := range LeaseHeaders {
				pr.Out.Header.Del(h)
			}
			if bearerUsed {
				pr.Out.Header.Del("Authorization")
			}
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
