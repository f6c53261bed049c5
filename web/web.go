// Package web is the browser terminal page, embedded into the gateway
// binary: index.html at /, our own JS and CSS and the vendored xterm.js
// files under /assets/. The xterm.js files come from npm (pinned in
// package.json and package-lock.json) and are copied into static/vendor by
// `make web`; they are not committed, so a build without them still
// compiles and its page says what is missing.
package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var embedded embed.FS

// AssetsPrefix is the URL path under which the page's files are served.
const AssetsPrefix = "/assets/"

// vendorFiles are the files `make web` copies; the page cannot work
// without them.
var vendorFiles = []string{"vendor/xterm.mjs", "vendor/xterm.css", "vendor/addon-fit.mjs"}

// Handler serves the page at / and its files under AssetsPrefix (GET and
// HEAD; anything else is 405). Mount it on exactly those two paths: it
// answers 404 for everything else.
func Handler() http.Handler {
	static, err := fs.Sub(embedded, "static")
	if err != nil {
		panic(err) // the embed directive guarantees the directory
	}
	return newHandler(static)
}

// file is one served file, read once at start-up: the embedded files
// never change, so each gets a content-hash ETag.
type file struct {
	body  []byte
	ctype string
	etag  string
}

type handler struct {
	files   map[string]file // by path relative to static/
	missing []string        // vendor files absent from this build
}

func newHandler(static fs.FS) *handler {
	h := &handler{files: map[string]file{}}
	fs.WalkDir(static, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(static, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		h.files[p] = file{body: body, ctype: contentType(p), etag: `"` + hex.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	for _, v := range vendorFiles {
		if _, ok := h.files[v]; !ok {
			h.missing = append(h.missing, v)
		}
	}
	return h
}

func contentType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js", ".mjs":
		return "text/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".md", ".txt":
		return "text/plain; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	}
	return "application/octet-stream"
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var name string
	switch {
	case r.URL.Path == "/":
		name = "index.html"
		if len(h.missing) > 0 {
			h.serveMissing(w)
			return
		}
		setPageHeaders(w, r)
	case strings.HasPrefix(r.URL.Path, AssetsPrefix):
		name = strings.TrimPrefix(r.URL.Path, AssetsPrefix)
	}
	f, ok := h.files[name]
	if !ok || name == "" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", f.ctype)
	w.Header().Set("Etag", f.etag)
	// Revalidate every time (cheap with the ETag): a new gateway build
	// must never run against a cached older script.
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}

// setPageHeaders locks the page down: everything it loads comes from the
// gateway itself (xterm.js adds inline styles, hence 'unsafe-inline' for
// styles only), and it talks only to this gateway over HTTP and
// WebSocket.
func setPageHeaders(w http.ResponseWriter, r *http.Request) {
	host := r.Host
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "+
		"img-src 'self' data:; connect-src 'self' ws://"+host+" wss://"+host+"; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	w.Header().Set("Referrer-Policy", "no-referrer")
}

// serveMissing answers / in a build without the vendored xterm.js files.
func (h *handler) serveMissing(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusServiceUnavailable)
	var b strings.Builder
	b.WriteString(`<!doctype html><html lang="en"><meta charset="utf-8"><title>sandgate: terminal page not built</title>` +
		`<body style="font-family:sans-serif;max-width:40em;margin:2em auto;padding:0 1em">` +
		`<h1>The terminal page is missing its xterm.js files</h1>` +
		`<p>This gateway was built without the vendored xterm.js files the page needs:</p><ul>`)
	for _, m := range h.missing {
		b.WriteString("<li><code>web/static/" + m + "</code></li>")
	}
	b.WriteString(`</ul><p>Run <code>make web</code> (npm ci, then a copy into <code>web/static/vendor</code>) ` +
		`and rebuild, or simply <code>make build</code>, which does both. The REST API under <code>/v1</code> works regardless.</p></body></html>`)
	w.Write([]byte(b.String()))
}
