package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// The control plane: E2B's REST API as the SDKs call it.

// maxControlBody caps a control-plane request body.
const maxControlBody = 1 << 20

// defaultTimeout is a sandbox's lifetime when a create gives none (the
// SDKs always send one; theirs is 300 s too).
const defaultTimeout = 300 * time.Second

// baseTemplates are the template ids that mean the provider's default
// image.
var baseTemplates = []string{"", "base", "default"}

func (s *server) controlRoutes(mux *http.ServeMux) {
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		mux.HandleFunc("POST "+p, s.create)
		mux.HandleFunc("GET "+p, s.list)
	}
	mux.HandleFunc("GET /sandboxes/{id}", s.get)
	mux.HandleFunc("DELETE /sandboxes/{id}", s.kill)
	mux.HandleFunc("GET /sandboxes/{id}/metrics", s.metrics)
	mux.HandleFunc("POST /sandboxes/{id}/timeout", s.setTimeout)
	mux.HandleFunc("POST /sandboxes/{id}/refreshes", s.refresh)
	mux.HandleFunc("POST /sandboxes/{id}/pause", s.pause)
	mux.HandleFunc("POST /sandboxes/{id}/resume", s.connectSandbox)
	mux.HandleFunc("POST /sandboxes/{id}/connect", s.connectSandbox)
	mux.HandleFunc("POST /v2/sandboxes/{id}/connect", s.connectSandbox)
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	mux.HandleFunc("GET /snapshots", s.listSnapshots)
	mux.HandleFunc("DELETE /templates/{id}", s.deleteSnapshot)
	s.volumeRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, providers.Errorf(providers.ErrUnsupported, "%s %s is not supported by sandgate's E2B face", r.Method, r.URL.Path))
	})
}

// apiCaller is the caller of a control-plane request: its X-API-Key (or
// Authorization: Bearer) is a sandgate API key.
func apiCaller(r *http.Request) sandbox.Caller {
	key := strings.TrimSpace(r.Header.Get("X-API-Key"))
	if key == "" {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		key = strings.TrimSpace(key)
	}
	return sandbox.Caller{Bearer: key}
}

// createBody is the create request as the SDKs send it. Fields sandgate
// cannot honour yet are decoded to be refused by name.
type createBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"` // seconds
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AutoPause           *bool             `json:"autoPause"`
	AutoResume          *autoResume       `json:"autoResume"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             json.RawMessage   `json:"network"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	MCP                 json.RawMessage   `json:"mcp"`
	Secure              *bool             `json:"secure"`
}

// autoResume is create's lifecycle.autoResume: traffic resuming a
// sandbox paused at its timeout.
type autoResume struct {
	Enabled bool `json:"enabled"`
}

// sandboxReply is a sandbox as E2B's API describes it (create, connect,
// get and list use subsets of it).
type sandboxReply struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	ClientID        string            `json:"clientID"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain"`
	StartedAt       *time.Time        `json:"startedAt,omitempty"`
	EndAt           *time.Time        `json:"endAt,omitempty"`
	State           string            `json:"state,omitempty"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	// AllowInternetAccess, Network and Lifecycle: get only.
	AllowInternetAccess *bool           `json:"allowInternetAccess,omitempty"`
	Network             *networkReply   `json:"network,omitempty"`
	Lifecycle           *lifecycleReply `json:"lifecycle,omitempty"`
}

// lifecycleReply is what a sandbox does at its timeout, as E2B's get
// describes it.
type lifecycleReply struct {
	OnTimeout  string `json:"onTimeout"` // kill or pause
	AutoResume bool   `json:"autoResume"`
}

// decode reads r's JSON body into v (an empty body leaves v as it is).
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxControlBody+1))
	if err != nil {
		return providers.Wrap(providers.ErrInvalid, err, "reading the body failed")
	}
	if len(b) > maxControlBody {
		return providers.Errorf(providers.ErrTooLarge, "the body is over %d bytes", maxControlBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return providers.InvalidFields{{Field: "body", Message: "is not valid JSON of this request: " + err.Error()}}
	}
	return nil
}

// timeoutOf is a timeout in seconds as a duration, or ErrInvalid naming
// the field.
func timeoutOf(sec *int64, bad *providers.InvalidFields) *time.Duration {
	d := defaultTimeout
	if sec != nil {
		if *sec <= 0 {
			bad.Add("timeout", "must be a positive number of seconds")
			return nil
		}
		d = time.Duration(*sec) * time.Second
	}
	return &d
}

func (s *server) create(w http.ResponseWriter, r *http.Request) {
	c := apiCaller(r)
	// The key is checked before the body is read.
	if _, _, err := s.svc.Authenticate(r.Context(), c, ""); err != nil {
		s.writeError(w, r, err)
		return
	}
	var body createBody
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	var bad providers.InvalidFields
	ttl := timeoutOf(body.Timeout, &bad)
	if body.AutoResume != nil && body.AutoResume.Enabled {
		bad.Add("autoResume", "is not supported by sandgate's E2B face: a sandbox paused at its timeout resumes on connect")
	}
	pol := egressOf(body.AllowInternetAccess, body.Network, &bad)
	mounts := mountsOf(body.VolumeMounts, &bad)
	if len(body.MCP) > 0 && string(body.MCP) != "null" {
		bad.Add("mcp", "is not supported by sandgate's E2B face yet")
	}
	if body.Secure != nil && !*body.Secure {
		bad.Add("secure", "must be true: sandgate always requires the access token")
	}
	if err := bad.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	req := sandbox.CreateRequest{
		Image: body.TemplateID, TTL: ttl, Env: body.EnvVars, Metadata: body.Metadata,
		PauseOnExpiry: body.AutoPause != nil && *body.AutoPause, Egress: pol, Volumes: mounts,
	}
	switch {
	case slices.Contains(baseTemplates, req.Image):
		req.Image = ""
	case strings.HasPrefix(req.Image, snapshotPrefix):
		req.Image, req.SnapshotID = "", req.Image
	}
	template := templateOf(req.Image)
	if req.SnapshotID != "" {
		template = req.SnapshotID
	}
	ref, err := s.svc.Create(r.Context(), c, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, sandboxReply{
		SandboxID: ref.SandboxID, TemplateID: template, ClientID: clientID,
		EnvdVersion: EnvdVersion, EnvdAccessToken: ref.Token,
	})
}

// clientID is the clientID every reply carries (E2B's is its cluster's).
const clientID = "sandgate"

// templateOf is the template id of a sandbox of image ("base": the
// provider's default).
func templateOf(image string) string {
	if image == "" {
		return "base"
	}
	return image
}

// stateOf is a sandbox's state as E2B names it: running or paused (a
// sandbox in any other state is not listed, as E2B lists none).
func stateOf(st providers.State) (string, bool) {
	switch st {
	case providers.StateRunning:
		return "running", true
	case providers.StatePaused:
		return "paused", true
	}
	return "", false
}

// replyOf describes sandbox info as E2B's get and list do.
func replyOf(info sandbox.Info) sandboxReply {
	st, _ := stateOf(info.State)
	started := info.CreatedAt
	end := info.ExpiresAt
	if end.IsZero() {
		end = started.Add(100 * 365 * 24 * time.Hour) // no expiry
	}
	rep := sandboxReply{
		SandboxID: info.ID, TemplateID: templateOf(info.Image), ClientID: clientID,
		EnvdVersion: EnvdVersion, StartedAt: &started, EndAt: &end, State: st,
		Metadata: info.Metadata,
	}
	if res := info.Resources; res.CPU != nil {
		rep.CPUCount = int(*res.CPU + 0.5)
	}
	if res := info.Resources; res.MemoryMiB != nil {
		rep.MemoryMB = int(*res.MemoryMiB)
	}
	if rep.Metadata == nil {
		rep.Metadata = map[string]string{}
	}
	rep.AllowInternetAccess, rep.Network = egressReply(info.Egress)
	rep.Lifecycle = &lifecycleReply{OnTimeout: "kill"}
	if info.PauseOnExpiry {
		rep.Lifecycle.OnTimeout = "pause"
	}
	return rep
}

func (s *server) get(w http.ResponseWriter, r *http.Request) {
	info, err := s.svc.Get(r.Context(), apiCaller(r), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, ok := stateOf(info.State); !ok {
		s.writeError(w, r, providers.Errorf(providers.ErrNotFound, "sandbox %s is %s", info.ID, info.State))
		return
	}
	writeJSON(w, http.StatusOK, replyOf(info))
}

// list answers GET /sandboxes and /v2/sandboxes: the caller's running
// and paused sandboxes, filtered by metadata (metadata=k%3Dv%26k2%3Dv2,
// every pair must match) and state (state=running,paused). All of them
// in one page (no x-next-token).
func (s *server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var bad providers.InvalidFields
	var want url.Values
	if m := q.Get("metadata"); m != "" {
		var err error
		if want, err = url.ParseQuery(m); err != nil {
			bad.Add("metadata", "must be URL-encoded key=value pairs joined by &")
		}
	}
	states := map[string]bool{}
	for _, v := range q["state"] {
		for st := range strings.SplitSeq(v, ",") {
			if st != "running" && st != "paused" {
				bad.Add("state", "must be running or paused (comma-separated)")
				break
			}
			states[st] = true
		}
	}
	if err := bad.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	infos, err := s.svc.List(r.Context(), apiCaller(r), sandbox.ListFilter{})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := []sandboxReply{}
	for _, info := range infos {
		st, ok := stateOf(info.State)
		if !ok || (len(states) > 0 && !states[st]) {
			continue
		}
		match := true
		for k, vs := range want {
			if v, ok := info.Metadata[k]; !ok || !slices.Contains(vs, v) {
				match = false
				break
			}
		}
		if match {
			out = append(out, replyOf(info))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *server) kill(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Delete(r.Context(), apiCaller(r), r.PathValue("id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// setTimeout sets the sandbox to end timeout seconds from now.
func (s *server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	var bad providers.InvalidFields
	if body.Timeout == nil {
		bad.Add("timeout", "is required (seconds)")
	}
	ttl := timeoutOf(body.Timeout, &bad)
	if err := bad.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := s.svc.Renew(r.Context(), apiCaller(r), r.PathValue("id"), ttl); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// refresh extends the sandbox's life by duration seconds (E2B's keep
// alive): as set timeout.
func (s *server) refresh(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Duration *int64 `json:"duration"`
	}
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	var bad providers.InvalidFields
	ttl := timeoutOf(body.Duration, &bad)
	if err := bad.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := s.svc.Renew(r.Context(), apiCaller(r), r.PathValue("id"), ttl); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause pauses a running sandbox: 409 when it is already paused (the SDK
// then says false), 501 when the provider cannot pause (the SDK raises
// SandboxError).
func (s *server) pause(w http.ResponseWriter, r *http.Request) {
	c, id := apiCaller(r), r.PathValue("id")
	info, err := s.svc.Get(r.Context(), c, id)
	if err == nil && info.State == providers.StatePaused {
		err = providers.Errorf(providers.ErrConflict, "sandbox %s is already paused", id)
	}
	if err == nil {
		_, err = s.svc.Pause(r.Context(), c, id)
	}
	if providers.Kind(err) == providers.ErrUnsupported {
		// Not 409, which the SDKs take for "already paused" (pause
		// answers false): a provider that cannot pause is an error.
		writeJSON(w, http.StatusNotImplemented, apiError{Code: http.StatusNotImplemented, Message: messageOf(err)})
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connectSandbox answers the SDKs' connect (and the older resume): a
// paused sandbox is resumed, a timeout given resets its life, and the
// reply carries a fresh owner lease as the access token.
func (s *server) connectSandbox(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	var bad providers.InvalidFields
	var ttl *time.Duration
	if body.Timeout != nil {
		ttl = timeoutOf(body.Timeout, &bad)
	}
	if err := bad.Err(); err != nil {
		s.writeError(w, r, err)
		return
	}
	c, id := apiCaller(r), r.PathValue("id")
	info, err := s.svc.Get(r.Context(), c, id)
	if err == nil {
		if _, ok := stateOf(info.State); !ok {
			err = providers.Errorf(providers.ErrNotFound, "sandbox %s is %s", id, info.State)
		}
	}
	if err == nil && info.State == providers.StatePaused {
		info, err = s.svc.Resume(r.Context(), c, id)
	}
	if err == nil && ttl != nil {
		info, err = s.svc.Renew(r.Context(), c, id, ttl)
	}
	var ref sandbox.Ref
	if err == nil {
		ref, err = s.svc.Mint(r.Context(), c, id, sandbox.ScopeOwner, nil)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rep := replyOf(info)
	rep.EnvdAccessToken = ref.Token
	writeJSON(w, http.StatusCreated, rep)
}

// snapshotPrefix begins every snapshot id: a template id with it is a
// snapshot (E2B's snapshots are templates too).
const snapshotPrefix = "snp-"

// snapshotReply is a snapshot as E2B's API describes it.
type snapshotReply struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// createSnapshot snapshots a sandbox (it keeps running: sandgate's
// snapshots need no pause); Sandbox.create(snapshotID) starts from it.
func (s *server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	sn, err := s.svc.Snapshot(r.Context(), apiCaller(r), r.PathValue("id"), body.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotReply{SnapshotID: sn.ID, Names: []string{sn.Name}})
}

// listSnapshots lists the caller's snapshots, of one sandbox
// (sandboxID=) or named name= if asked; one page.
func (s *server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	list, err := s.svc.Snapshots(r.Context(), apiCaller(r))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	out := []snapshotReply{}
	for _, sn := range list {
		if (q.Get("sandboxID") != "" && sn.SandboxID != q.Get("sandboxID")) || (q.Get("name") != "" && sn.Name != q.Get("name")) {
			continue
		}
		out = append(out, snapshotReply{SnapshotID: sn.ID, Names: []string{sn.Name}})
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot deletes a snapshot (E2B deletes templates here; only
// snapshots are templates of sandgate's).
func (s *server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !strings.HasPrefix(id, snapshotPrefix) {
		s.writeError(w, r, providers.Errorf(providers.ErrUnsupported, "deleting template %s: templates are images here, managed outside the E2B face", id))
		return
	}
	// sandgate's delete is idempotent; E2B answers 404 for a snapshot
	// that is not there (the SDK then says false).
	_, err := s.svc.GetSnapshot(r.Context(), apiCaller(r), id)
	if err == nil {
		_, err = s.svc.DeleteSnapshot(r.Context(), apiCaller(r), id)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
