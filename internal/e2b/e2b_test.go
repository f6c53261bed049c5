package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem"
	"github.com/sandgate/sandgate/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/sandgate/sandgate/internal/e2b/envd/process"
	"github.com/sandgate/sandgate/internal/e2b/envd/process/processconnect"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/sandbox"
	"github.com/sandgate/sandgate/internal/testkit"
)

// The E2B face's refusals, over the real service with the fake provider
// (the SDK itself runs against real providers in cmd/gateway's
// TestE2BSDK*): every bad input is a 400 (or InvalidArgument) naming
// what is wrong, and changes nothing.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testKey = "e2b_test_key"

type face struct {
	t   *testing.T
	srv *httptest.Server
	svc *sandbox.Service
}

func newFace(t *testing.T) *face { return newFaceWith(t, false) }

// newFaceWith is newFace, with terminal sessions (PTY processes and
// processes with stdin) when terminals is set.
func newFaceWith(t *testing.T, terminals bool) *face {
	t.Helper()
	p := fake.New()
	svc, err := sandbox.New(context.Background(), sandbox.Options{
		Provider: p, StateDir: t.TempDir(), APIKeys: []string{testKey},
		Clock: testkit.NewClock(time.Unix(1_800_000_000, 0)), ReapInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	o := Options{Service: svc}
	if terminals {
		o.PTY = pty.NewManager(svc, pty.Options{})
	}
	srv := httptest.NewServer(New(o))
	t.Cleanup(func() {
		srv.Close()
		if o.PTY != nil {
			o.PTY.Close()
		}
		svc.Close()
		p.Close()
	})
	return &face{t: t, srv: srv, svc: svc}
}

// call sends a control-plane request with the test key and returns the
// status and the decoded E2B error (zero for a success).
func (f *face) call(method, path, body string) (int, apiError) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+"/e2b/api"+path, strings.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", testKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var e apiError
	if res.StatusCode >= 400 {
		if err := json.Unmarshal(b, &e); err != nil || e.Code != res.StatusCode {
			f.t.Fatalf("%s %s: %d, not an E2B error: %s", method, path, res.StatusCode, b)
		}
	}
	return res.StatusCode, e
}

// sandboxes is how many sandboxes the service holds.
func (f *face) sandboxes() int {
	f.t.Helper()
	list, err := f.svc.List(context.Background(), sandbox.Caller{Bearer: testKey}, sandbox.ListFilter{})
	if err != nil {
		f.t.Fatal(err)
	}
	return len(list)
}

func TestCreateRefusals(t *testing.T) {
	f := newFace(t)
	for _, c := range []struct{ body, field string }{
		{`{"timeout":0}`, "timeout"},
		{`{"timeout":-5}`, "timeout"},
		{`{"autoPause":true,"autoResume":{"enabled":true}}`, "autoResume"},
		{`{"network":{"allowOut":["a.test"]}}`, "network.allowOut[0]"},
		{`{"network":{"allowOut":["10.1.0.0/16"],"denyOut":["10.0.0.0/8"]}}`, "overlaps"},
		{`{"network":{"denyOut":["not an entry"]}}`, "network.denyOut"},
		{`{"allow_internet_access":false,"network":{"allowOut":["a..test"]}}`, "network.allowOut"},
		{`{"network":{"egressProxy":{"address":"p:1080"}}}`, "network.egressProxy"},
		{`{"network":{"allowOut":"1.1.1.1"}}`, "network.allowOut"},
		{`{"network":[1]}`, "network"},
		{`{"volumeMounts":[{"name":"v","path":"/data"}]}`, "volumes[0].volume"}, // no such volume
		{`{"volumeMounts":[{"name":"v"}]}`, "volumeMounts[0]"},
		{`{"volumeMounts":{"name":"v"}}`, "volumeMounts"},
		{`{"mcp":{"x":{}}}`, "mcp"},
		{`{"secure":false}`, "secure"},
		{`{"templateID":`, "body"},
		{`{"metadata":{"a":1}}`, "body"},
	} {
		st, e := f.call("POST", "/v2/sandboxes", c.body)
		if st != http.StatusBadRequest || !strings.Contains(e.Message, c.field) {
			t.Errorf("create %s: %d %q, want 400 naming %s", c.body, st, e.Message, c.field)
		}
	}
	if n := f.sandboxes(); n != 0 {
		t.Fatalf("refused creates made %d sandboxes", n)
	}
	// The key is checked first.
	req, _ := http.NewRequest("POST", f.srv.URL+"/e2b/api/v2/sandboxes", strings.NewReader(`{}`))
	req.Header.Set("X-API-Key", "e2b_wrong")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong key: %d, want 401", res.StatusCode)
	}
}

func TestControlRefusals(t *testing.T) {
	f := newFace(t)
	st, _ := f.call("POST", "/v2/sandboxes", `{"templateID":"base","timeout":60,"metadata":{"k":"v"}}`)
	if st != http.StatusCreated {
		t.Fatalf("create: %d", st)
	}
	list, err := f.svc.List(context.Background(), sandbox.Caller{Bearer: testKey}, sandbox.ListFilter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %d", err, len(list))
	}
	id, ttl := list[0].ID, list[0].TTL
	for _, c := range []struct{ method, path, body, field string }{
		{"GET", "/v2/sandboxes?state=gone", "", "state"},
		{"GET", "/v2/sandboxes?metadata=%3B%25zz", "", "metadata"},
		{"POST", "/sandboxes/" + id + "/timeout", `{}`, "timeout"},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":0}`, "timeout"},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":"x"}`, "body"},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":-1}`, "timeout"},
		{"POST", "/sandboxes/" + id + "/snapshots", `{"name":"` + strings.Repeat("n", 129) + `"}`, "name"},
		{"POST", "/sandboxes/" + id + "/snapshots", `{"name":7}`, "body"},
		{"GET", "/sandboxes/" + id + "/metrics?start=yesterday", "", "start"},
		{"GET", "/sandboxes/" + id + "/metrics?end=-5", "", "end"},
		{"GET", "/sandboxes/" + id + "/metrics?start=2000000000&end=1000000000", "", "end"},
	} {
		st, e := f.call(c.method, c.path, c.body)
		if st != http.StatusBadRequest || !strings.Contains(e.Message, c.field) {
			t.Errorf("%s %s %s: %d %q, want 400 naming %s", c.method, c.path, c.body, st, e.Message, c.field)
		}
	}
	info, err := f.svc.Get(context.Background(), sandbox.Caller{Bearer: testKey}, id)
	if err != nil || info.TTL != ttl {
		t.Fatalf("a refused request changed the sandbox: %v ttl %v, was %v", err, info.TTL, ttl)
	}
	if st, _ := f.call("GET", "/sandboxes/sbx-nosuchsandbox00000000", ""); st != http.StatusNotFound {
		t.Fatalf("an unknown sandbox: %d, want 404", st)
	}
	if st, _ := f.call("GET", "/templates", ""); st != http.StatusConflict {
		t.Fatalf("an unsupported route: %d, want 409", st)
	}
	if st, e := f.call("DELETE", "/templates/python-3", ""); st != http.StatusConflict || !strings.Contains(e.Message, "python-3") {
		t.Fatalf("deleting a template that is not a snapshot: %d %q, want 409 naming it", st, e.Message)
	}
	if st, _ := f.call("DELETE", "/templates/snp-nosuchsnapshot00000", ""); st != http.StatusNotFound {
		t.Fatalf("deleting an unknown snapshot: %d, want 404", st)
	}
}

// dataPlane returns Connect clients of the data plane sending hdr.
func (f *face) dataPlane(hdr map[string]string) (processconnect.ProcessClient, filesystemconnect.FilesystemClient) {
	base := f.srv.URL + "/e2b/sandbox"
	in := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			for k, v := range hdr {
				req.Header().Set(k, v)
			}
			return next(ctx, req)
		}
	}), headerStream(hdr))
	return processconnect.NewProcessClient(http.DefaultClient, base, connect.WithProtoJSON(), in),
		filesystemconnect.NewFilesystemClient(http.DefaultClient, base, connect.WithProtoJSON(), in)
}

// headerStream sets hdr on streaming calls.
type headerStream map[string]string

func (h headerStream) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return next }
func (h headerStream) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h {
			conn.RequestHeader().Set(k, v)
		}
		return conn
	}
}
func (h headerStream) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return 0
}

func TestDataPlaneRefusals(t *testing.T) {
	f := newFace(t)
	ctx := testkit.Context(t, time.Minute)
	mk := func() (string, string) {
		ref, err := f.svc.Create(ctx, sandbox.Caller{Bearer: testKey}, sandbox.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return ref.SandboxID, ref.Token
	}
	id, tok := mk()
	other, _ := mk()

	// Who: the sandbox header, then the token.
	for _, c := range []struct {
		hdr  map[string]string
		want connect.Code
	}{
		{map[string]string{"X-Access-Token": tok}, connect.CodeInvalidArgument},
		{map[string]string{"E2b-Sandbox-Id": id}, connect.CodeUnauthenticated},
		{map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": "sgl1.forged.token"}, connect.CodeUnauthenticated},
		{map[string]string{"E2b-Sandbox-Id": other, "X-Access-Token": tok}, connect.CodePermissionDenied},
		{map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok, "Authorization": "Basic %%%"}, connect.CodeInvalidArgument},
	} {
		proc, fsys := f.dataPlane(c.hdr)
		if _, err := proc.List(ctx, connect.NewRequest(&process.ListRequest{})); codeOf(err) != c.want {
			t.Errorf("List with %v: %v, want %v", c.hdr, err, c.want)
		}
		if _, err := fsys.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/"})); codeOf(err) != c.want {
			t.Errorf("Stat with %v: %v, want %v", c.hdr, err, c.want)
		}
	}

	proc, fsys := f.dataPlane(map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok})
	start := func(req *process.StartRequest) error {
		st, err := proc.Start(ctx, connect.NewRequest(req))
		if err != nil {
			return err
		}
		defer st.Close()
		for st.Receive() {
		}
		return st.Err()
	}
	if err := start(&process.StartRequest{Process: &process.ProcessConfig{}}); codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "cmd") {
		t.Errorf("Start without cmd: %v", err)
	}
	if err := start(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/true"}, Pty: &process.PTY{}}); codeOf(err) != connect.CodeUnimplemented {
		t.Errorf("Start with a PTY: %v", err)
	}
	if _, err := proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 1}},
	})); codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "signal") {
		t.Errorf("SendSignal without a signal: %v", err)
	}
	if _, err := proc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Signal:  process.Signal_SIGNAL_SIGKILL,
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "not-a-command-id"}},
	})); codeOf(err) != connect.CodeNotFound {
		t.Errorf("SendSignal to an unknown tag: %v", err)
	}
	if _, err := fsys.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: strings.Repeat("a", maxRPCMessage)})); codeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("a message over the cap: %v", err)
	}
	if _, err := fsys.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/", Depth: maxListDepth + 1})); codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "depth") {
		t.Errorf("ListDir too deep: %v", err)
	}
	for name, call := range map[string]func() error{
		"MakeDir": func() error {
			_, err := fsys.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{}))
			return err
		},
		"Remove": func() error {
			_, err := fsys.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{}))
			return err
		},
		"Move": func() error {
			_, err := fsys.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: "/a"}))
			return err
		},
	} {
		if err := call(); codeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s without a path: %v", name, err)
		}
	}

	// The file routes.
	for _, c := range []struct {
		method, query, ctype string
		hdr                  map[string]string
		want                 int
		field                string
	}{
		{"GET", "", "", nil, 400, "path"},
		{"POST", "", "application/octet-stream", nil, 400, "path"},
		{"POST", "path=/x", "multipart/form-data; boundary=zz", nil, 400, "file part"},
		{"POST", "path=/x", "application/octet-stream", map[string]string{"Content-Encoding": "gzip"}, 400, "not valid gzip"},
		{"POST", "path=/x", "application/octet-stream", map[string]string{"Content-Encoding": "br"}, 409, "Content-Encoding"},
		{"POST", "path=/x", "application/octet-stream", map[string]string{"X-Metadata-Owner": "me"}, 409, "metadata"},
		{"GET", "path=/x&signature=abc", "", nil, 409, "signed"},
	} {
		req, _ := http.NewRequest(c.method, f.srv.URL+"/e2b/sandbox/files?"+c.query, strings.NewReader("data"))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("X-Access-Token", tok)
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		for k, v := range c.hdr {
			req.Header.Set(k, v)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var e apiError
		json.Unmarshal(b, &e)
		if res.StatusCode != c.want || e.Code != c.want || !strings.Contains(e.Message, c.field) {
			t.Errorf("%s /files?%s: %d %s, want %d naming %s", c.method, c.query, res.StatusCode, b, c.want, c.field)
		}
	}
	if _, _, err := f.svc.ReadFile(ctx, sandbox.Caller{Lease: tok}, id, "/x", 0); providers.Kind(err) != providers.ErrNotFound {
		t.Fatalf("a refused upload wrote /x (reading it: %v)", err)
	}
}

// E2B's allow_internet_access and network as sandgate egress policies.
func TestEgressOf(t *testing.T) {
	no, yes := false, true
	for _, c := range []struct {
		internet *bool
		network  string
		want     string // the policy as /v1 writes it; "" = nil
	}{
		{nil, ``, ``},
		{nil, `null`, ``},
		{&yes, ``, `"all"`},
		{&no, ``, `"none"`},
		{nil, `{"denyOut":["0.0.0.0/0"]}`, `"none"`},
		{nil, `{"denyOut":["10.0.0.0/8","1.2.3.4"]}`, `{"allow":["*"],"deny":["10.0.0.0/8","1.2.3.4/32"]}`},
		{&no, `{"allowOut":["a.test","*.b.test","203.0.113.0/24"]}`, `{"allow":["a.test","*.b.test","203.0.113.0/24"],"deny":[]}`},
		// allowOut wins over denyOut: with everything denied, the rest of
		// denyOut adds nothing.
		{nil, `{"allowOut":["a.test","10.1.2.3"],"denyOut":["0.0.0.0/0","10.0.0.0/8"]}`, `{"allow":["a.test","10.1.2.3/32"],"deny":[]}`},
		// An allowOut address outside denyOut is allowed anyway.
		{nil, `{"allowOut":["192.0.2.1"],"denyOut":["10.0.0.0/8"]}`, `{"allow":["*"],"deny":["10.0.0.0/8"]}`},
	} {
		var bad providers.InvalidFields
		pol := egressOf(c.internet, json.RawMessage(c.network), &bad)
		if err := bad.Err(); err != nil {
			t.Errorf("%v %s: %v", c.internet, c.network, err)
			continue
		}
		got := ""
		if pol != nil {
			b, _ := json.Marshal(pol)
			got = string(b)
		}
		if got != c.want {
			t.Errorf("%v %s: %s, want %s", c.internet, c.network, got, c.want)
		}
	}
}

// A download is gzipped only when gzip alone is asked for.
func TestGzipOnly(t *testing.T) {
	for accept, want := range map[string]bool{
		"gzip": true, "GZip": true, " gzip ": true, "gzip;q=1": true, "gzip; q=0.5": true,
		"": false, "gzip, deflate": false, "gzip, deflate, br": false, "br": false, "identity": false,
		"gzip;q=0": false, "gzip; q=0.000": false, "*": false,
	} {
		if got := gzipOnly(accept); got != want {
			t.Errorf("gzipOnly(%q) = %v, want %v", accept, got, want)
		}
	}
}
