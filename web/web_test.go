package web

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func get(t *testing.T, h http.Handler, method, path string, hdr ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// complete is a build with the vendored files.
var complete = fstest.MapFS{
	"index.html":            {Data: []byte("<!doctype html><title>sandgate</title>")},
	"app.js":                {Data: []byte("import './pty.js';")},
	"pty.js":                {Data: []byte("export {};")},
	"style.css":             {Data: []byte("body{}")},
	"vendor/README.md":      {Data: []byte("placeholder")},
	"vendor/xterm.mjs":      {Data: []byte("export class Terminal {}")},
	"vendor/xterm.css":      {Data: []byte(".xterm{}")},
	"vendor/addon-fit.mjs":  {Data: []byte("export class FitAddon {}")},
	"vendor/LICENSE-xterm":  {Data: []byte("MIT")},
	"vendor/.hidden-ignore": {Data: []byte("x")},
}

func TestServesPageAndAssets(t *testing.T) {
	h := newHandler(complete)
	res := get(t, h, "GET", "/")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if b := body(t, res); !strings.Contains(b, "<title>sandgate</title>") {
		t.Fatalf("GET / body = %q", b)
	}
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "ws://example.com"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	for path, ctype := range map[string]string{
		"/assets/app.js":               "text/javascript",
		"/assets/vendor/xterm.mjs":     "text/javascript", // module scripts need a JS type
		"/assets/vendor/addon-fit.mjs": "text/javascript",
		"/assets/style.css":            "text/css",
		"/assets/vendor/xterm.css":     "text/css",
	} {
		res := get(t, h, "GET", path)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), ctype) {
			t.Errorf("GET %s = %d %q, want 200 %s", path, res.StatusCode, res.Header.Get("Content-Type"), ctype)
		}
		if res.Header.Get("Etag") == "" || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: headers %v", path, res.Header)
		}
	}
}

func TestRevalidatesWithETag(t *testing.T) {
	h := newHandler(complete)
	etag := get(t, h, "GET", "/assets/app.js").Header.Get("Etag")
	if res := get(t, h, "GET", "/assets/app.js", "If-None-Match", etag); res.StatusCode != http.StatusNotModified {
		t.Fatalf("conditional GET = %d, want 304", res.StatusCode)
	}
	if res := get(t, h, "GET", "/assets/style.css", "If-None-Match", etag); res.StatusCode != 200 {
		t.Fatalf("another file's ETag: %d, want 200", res.StatusCode)
	}
}

func TestRefusals(t *testing.T) {
	h := newHandler(complete)
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/assets/", 404},
		{"GET", "/assets/nope.js", 404},
		{"GET", "/assets/../web.go", 404},
		{"GET", "/index.html", 404}, // only at / and under /assets/
		{"GET", "/assets/vendor/.hidden-ignore", 200},
		{"POST", "/", 405},
		{"DELETE", "/assets/app.js", 405},
		{"HEAD", "/assets/app.js", 200},
	} {
		if res := get(t, h, c.method, c.path); res.StatusCode != c.want {
			t.Errorf("%s %s = %d, want %d", c.method, c.path, res.StatusCode, c.want)
		}
	}
}

// A build without `make web` compiles and says what is missing.
func TestMissingVendorFilesSaySo(t *testing.T) {
	bare := fstest.MapFS{
		"index.html":       {Data: []byte("<!doctype html>")},
		"app.js":           {Data: []byte("")},
		"vendor/README.md": {Data: []byte("placeholder")},
	}
	res := get(t, newHandler(bare), "GET", "/")
	b := body(t, res)
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET / without vendor files = %d, want 503", res.StatusCode)
	}
	for _, want := range []string{"make web", "vendor/xterm.mjs", "vendor/addon-fit.mjs"} {
		if !strings.Contains(b, want) {
			t.Errorf("page does not mention %q:\n%s", want, b)
		}
	}
}

// The real embedded tree has our page; a build made with `make web` (CI,
// `make test`) also has the vendored files.
func TestEmbedded(t *testing.T) {
	h := Handler().(*handler)
	for _, f := range []string{"index.html", "app.js", "pty.js", "style.css", "vendor/README.md"} {
		if _, ok := h.files[f]; !ok {
			t.Errorf("embedded files lack %s", f)
		}
	}
	if len(h.missing) > 0 {
		if os.Getenv("CI") == "true" {
			t.Errorf("vendor files missing in CI (make web did not run?): %v", h.missing)
		} else {
			t.Logf("vendor files missing (run make web): %v", h.missing)
		}
	}
}
