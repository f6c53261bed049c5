package handlers

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBadInput: each kind of bad input gets its status and a clear
// problem, and changes nothing.
func TestBadInput(t *testing.T) {
	g := newGateway(t, 4096)
	a := g.create(map[string]any{"files": map[string]string{"seed.txt": "seed", "dir/inner.txt": "x"}})
	id := a.SandboxID
	own := lease(a.Token)
	raw := func(s string) string { return s }
	cmd := g.startCommand(id, a.Token, map[string]any{"command": "printf abc"})
	if r := g.do("GET", "/v1/sandboxes/"+id+"/commands/"+cmd.CommandID+"/wait", nil, own); r.status != 200 {
		t.Fatalf("wait: %d %s", r.status, r.body)
	}
	cmds := "/v1/sandboxes/" + id + "/commands/"
	cases := []struct {
		name         string
		method, path string
		body         any
		hdr          map[string]string
		status       int
		code         string
		mention      string // the detail or an error names this
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", raw(`{"ttl_s": 5,`), key(), 400, "invalid_input", "JSON"},
		{"wrong type", "POST", "/v1/sandboxes", raw(`{"ttl_s": "long"}`), key(), 422, "schema_violation", "ttl_s"},
		{"unknown field", "POST", "/v1/sandboxes", raw(`{"colour": "red"}`), key(), 422, "schema_violation", "colour"},
		{"port out of range", "POST", "/v1/sandboxes", raw(`{"ports": [0, 70000]}`), key(), 422, "schema_violation", "ports"},
		{"duplicate ports", "POST", "/v1/sandboxes", raw(`{"ports": [80, 80]}`), key(), 422, "schema_violation", "ports"},
		{"negative ttl", "POST", "/v1/sandboxes", raw(`{"ttl_s": -1}`), key(), 422, "schema_violation", "ttl_s"},
		{"unknown provider option", "POST", "/v1/sandboxes", raw(`{"provider_options": {"gpus": "all"}}`), key(), 400, "invalid_input", "gpus"},
		{"relative workdir", "POST", "/v1/sandboxes", raw(`{"workdir": "work"}`), key(), 400, "invalid_input", "workdir"},
		{"file path escapes", "POST", "/v1/sandboxes", raw(`{"files": {"../../etc/x": "y"}}`), key(), 400, "invalid_input", ".."},
		{"oversize body", "POST", "/v1/sandboxes", raw(`{"env": {"A": "` + strings.Repeat("x", 8192) + `"}}`), key(), 413, "too_large", "too large"},
		{"exec without command", "POST", "/v1/sandboxes/" + id + "/exec", raw(`{"cwd": "/"}`), own, 422, "schema_violation", "command"},
		{"exec command wrong type", "POST", "/v1/sandboxes/" + id + "/exec", raw(`{"command": ["ls"]}`), own, 422, "schema_violation", "command"},
		{"exec bad base64 stdin", "POST", "/v1/sandboxes/" + id + "/exec", raw(`{"command": "cat", "stdin_b64": "***"}`), own, 400, "invalid_input", "stdin_b64"},
		{"exec cwd escapes", "POST", "/v1/sandboxes/" + id + "/exec", raw(`{"command": "ls", "cwd": "../.."}`), own, 400, "invalid_input", "cwd"},
		{"upload bad base64", "POST", "/v1/sandboxes/" + id + "/upload", raw(`{"target_path": "n.txt", "contents_b64": "@@@"}`), own, 400, "invalid_input", "contents_b64"},
		{"upload path escapes", "POST", "/v1/sandboxes/" + id + "/upload", raw(`{"target_path": "../n.txt", "contents_b64": "aGk="}`), own, 400, "invalid_input", ".."},
		{"upload missing field", "POST", "/v1/sandboxes/" + id + "/upload", raw(`{"target_path": "n.txt"}`), own, 422, "schema_violation", "contents_b64"},
		{"download missing file", "GET", "/v1/sandboxes/" + id + "/download?remote_path=nope.txt", nil, own, 404, "not_found", "nope.txt"},
		{"download a directory", "GET", "/v1/sandboxes/" + id + "/download?remote_path=dir", nil, own, 400, "invalid_input", "directory"},
		{"download without path", "GET", "/v1/sandboxes/" + id + "/download", nil, own, 400, "invalid_input", "remote_path"},
		{"get file escapes", "GET", "/v1/sandboxes/" + id + "/files?path=a/../../etc/passwd", nil, own, 400, "invalid_input", ".."},
		{"put file escapes", "PUT", "/v1/sandboxes/" + id + "/files?path=../x", []byte("data"), own, 400, "invalid_input", ".."},
		{"put file without path", "PUT", "/v1/sandboxes/" + id + "/files", []byte("data"), own, 400, "invalid_input", "path"},
		{"file info escapes", "GET", "/v1/sandboxes/" + id + "/files/info?path=../etc/passwd", nil, own, 400, "invalid_input", ".."},
		{"file info without path", "GET", "/v1/sandboxes/" + id + "/files/info", nil, own, 400, "invalid_input", "path"},
		{"file info missing", "GET", "/v1/sandboxes/" + id + "/files/info?path=nope.txt", nil, own, 404, "not_found", "nope.txt"},
		{"list escapes", "GET", "/v1/sandboxes/" + id + "/files/list?path=a/../../x", nil, own, 400, "invalid_input", ".."},
		{"list a file", "GET", "/v1/sandboxes/" + id + "/files/list?path=dir/inner.txt", nil, own, 400, "invalid_input", "not a directory"},
		// Credentials are verified before the request is validated: a
		// lease names its sandbox, and this is not it.
		{"bad sandbox id", "GET", "/v1/sandboxes/sbx-NOT-VALID", nil, own, 403, "forbidden", "another sandbox"},
		{"bad port", "GET", "/v1/sandboxes/" + id + "/endpoints/0", nil, own, 400, "invalid_input", "port"},
		{"non-numeric port", "GET", "/v1/sandboxes/" + id + "/endpoints/http", nil, own, 400, "invalid_input", "port"},
		{"bad status filter", "GET", "/v1/sandboxes?status=sleeping", nil, key(), 400, "invalid_input", "status"},
		{"bad label filter", "GET", "/v1/sandboxes?label=novalue", nil, key(), 400, "invalid_input", "label"},
		{"bad lease scope", "POST", "/v1/sandboxes/" + id + "/leases", raw(`{"scope": "admin"}`), own, 422, "schema_violation", "scope"},
		{"zero lease ttl", "POST", "/v1/sandboxes/" + id + "/leases", raw(`{"scope": "operate", "ttl_s": 0}`), own, 400, "invalid_input", "ttl_s"},
		{"renew negative", "POST", "/v1/sandboxes/" + id + "/renew", raw(`{"ttl_s": -5}`), own, 422, "schema_violation", "ttl_s"},
		{"resume running", "POST", "/v1/sandboxes/" + id + "/resume", nil, own, 409, "conflict", "running"},
		{"unknown command", "GET", cmds + "cmd-0123456789abcdef", nil, own, 404, "not_found", "cmd-0123456789abcdef"},
		{"ill-formed command id", "GET", cmds + "cmd-XYZ", nil, own, 404, "not_found", "cmd-XYZ"},
		{"wait unknown command", "GET", cmds + "cmd-0123456789abcdef/wait", nil, own, 404, "not_found", "cmd-0123456789abcdef"},
		{"signal unknown command", "POST", cmds + "cmd-0123456789abcdef/signal", raw(`{"signal": "SIGTERM"}`), own, 404, "not_found", "cmd-0123456789abcdef"},
		{"delete unknown command", "DELETE", cmds + "cmd-0123456789abcdef", nil, own, 404, "not_found", "cmd-0123456789abcdef"},
		{"output unknown command", "GET", cmds + "cmd-0123456789abcdef/output", nil, own, 404, "not_found", "cmd-0123456789abcdef"},
		{"output since beyond the end", "GET", cmds + cmd.CommandID + "/output?since=4", nil, own, 400, "invalid_input", "beyond its end"},
		{"output since negative", "GET", cmds + cmd.CommandID + "/output?since=-1", nil, own, 400, "invalid_input", "since"},
		{"output since not a number", "GET", cmds + cmd.CommandID + "/output?since=ten", nil, own, 400, "invalid_input", "since"},
		{"output since pair, raw", "GET", cmds + cmd.CommandID + "/output?since=1,2", nil, own, 400, "invalid_input", "since"},
		{"output bad stream", "GET", cmds + cmd.CommandID + "/output?stream=stdin", nil, own, 400, "invalid_input", "stream"},
		{"bad signal", "POST", cmds + cmd.CommandID + "/signal", raw(`{"signal": "SIGSTOP"}`), own, 400, "invalid_input", "signal"},
		{"wait too long", "GET", cmds + cmd.CommandID + "/wait?timeout_s=301", nil, own, 400, "invalid_input", "timeout_s"},
		{"command output cap too big", "POST", "/v1/sandboxes/" + id + "/commands", raw(`{"command": "true", "max_output_bytes": 1073741825}`), own, 422, "schema_violation", "max_output_bytes"},
		{"command bad base64 stdin", "POST", "/v1/sandboxes/" + id + "/commands", raw(`{"command": "cat", "stdin_b64": "***"}`), own, 400, "invalid_input", "stdin_b64"},
		{"exec negative timeout", "POST", "/v1/sandboxes/" + id + "/exec", raw(`{"command": "true", "timeout_s": -1}`), own, 422, "schema_violation", "timeout_s"},
		{"form content type", "POST", "/v1/sandboxes", raw(`{"ttl_s": 5}`), withHdr(key(), "Content-Type", "application/x-www-form-urlencoded"), 400, "invalid_input", "-H 'Content-Type: application/json'"},
		{"text content type", "POST", "/v1/sandboxes/" + id + "/exec", raw(`{"command": "true"}`), withHdr(own, "Content-Type", "text/plain"), 400, "invalid_input", `Content-Type: application/json (got \"text/plain\")`},
		{"unknown route", "GET", "/v1/nothing", nil, nil, 404, "not_found", "/v1/nothing"},
		{"wrong method", "PATCH", "/v1/sandboxes/" + id, nil, own, 405, "method_not_allowed", "PATCH"},
	}
	before := g.snapshot(id, a.Token)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			for k, v := range c.hdr {
				hdr[k] = v
			}
			if _, ok := c.body.([]byte); ok {
				hdr["Content-Type"] = "application/octet-stream"
			}
			r := g.do(c.method, c.path, c.body, hdr)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			p := r.problem(t)
			if p.Code != c.code {
				t.Errorf("code %q, want %q", p.Code, c.code)
			}
			if !strings.Contains(string(r.body), c.mention) {
				t.Errorf("problem does not mention %q: %s", c.mention, r.body)
			}
			if after := g.snapshot(id, a.Token); after != before {
				t.Fatalf("state changed:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

// withHdr is hdr plus one header.
func withHdr(hdr map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for hk, hv := range hdr {
		out[hk] = hv
	}
	return out
}

// snapshot describes the gateway's observable state: the sandboxes and
// the seeded sandbox's files and leases.
func (g *gw) snapshot(id, tok string) string {
	g.t.Helper()
	list := g.do("GET", "/v1/sandboxes", nil, key())
	var l struct {
		Sandboxes []struct {
			ID     string  `json:"sandbox_id"`
			Status string  `json:"status"`
			TTL    float64 `json:"ttl_s"`
		} `json:"sandboxes"`
	}
	list.json(g.t, &l)
	files := []string{}
	for _, f := range []string{"n.txt", "x", "/etc/x", "seed.txt"} {
		r := g.do("GET", "/v1/sandboxes/"+id+"/files?path="+f, nil, lease(tok))
		files = append(files, f+":"+string(rune('0'+r.status/100)))
	}
	out, _ := json.Marshal(map[string]any{"list": l, "files": files, "providerSandboxes": len(must(g.p.List(nil)))})
	return string(out)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestAllProblemsAtOnce: a body with several schema violations lists each.
func TestAllProblemsAtOnce(t *testing.T) {
	g := newGateway(t, 0)
	r := g.do("POST", "/v1/sandboxes", `{"ttl_s": "long", "colour": 1, "ports": [0], "env": {"A": 1}}`, key())
	if r.status != 422 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	p := r.problem(t)
	fields := map[string]bool{}
	for _, e := range p.Errors {
		fields[e.Field] = true
	}
	for _, want := range []string{"body.ttl_s", "body.ports.0", "body.env.A", "body"} {
		if !fields[want] {
			t.Errorf("no problem listed for %s: %s", want, r.body)
		}
	}
	if len(p.Errors) != 4 {
		t.Errorf("%d problems, want 4: %s", len(p.Errors), r.body)
	}
}

// TestUploadTooLargeSaysHowToStream: the base64 route's 413 names the
// streaming route that takes any size, and writes nothing.
func TestUploadTooLargeSaysHowToStream(t *testing.T) {
	g := newGatewayOpts(t, Options{MaxJSONBody: 4096, MaxUploadBody: 64 << 10})
	a := g.create(map[string]any{})
	body := `{"target_path": "big.bin", "contents_b64": "` + strings.Repeat("A", 128<<10) + `"}`
	r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/upload", body, lease(a.Token))
	if r.status != 413 || !strings.Contains(string(r.body), "PUT /v1/sandboxes/{id}/files") || !strings.Contains(string(r.body), "curl -T") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r := g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/files/info?path=big.bin", nil, lease(a.Token)); r.status != 404 || !strings.Contains(string(r.body), "big.bin") {
		t.Fatalf("after the refusal: %d %s", r.status, r.body)
	}
}

// TestExecTimeoutZeroIsTheDefault: timeout_s 0, which the contract
// allows, runs with the gateway's default like null.
func TestExecTimeoutZeroIsTheDefault(t *testing.T) {
	g := newGateway(t, 4096)
	a := g.create(map[string]any{})
	r := g.do("POST", "/v1/sandboxes/"+a.SandboxID+"/exec", `{"command": "echo ran", "timeout_s": 0}`, lease(a.Token))
	if r.status != 200 || !strings.Contains(string(r.body), `"return_code":0`) {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// TestListImages: any key lists what the provider runs; a provider that
// cannot list says the list is incomplete and why; no key is 401.
func TestListImages(t *testing.T) {
	g := newGateway(t, 4096)
	r := g.do("GET", "/v1/images", nil, key())
	var il struct {
		ProviderName string `json:"provider_name"`
		Images       []any  `json:"images"`
		Complete     bool   `json:"complete"`
		Note         string `json:"note"`
	}
	if r.status != 200 || json.Unmarshal(r.body, &il) != nil || il.Images == nil || il.Complete || !strings.Contains(il.Note, "cannot list") {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r := g.do("GET", "/v1/images", nil, nil); r.status != 401 {
		t.Fatalf("without a key: %d %s", r.status, r.body)
	}
}
