package handlers

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// seconds converts an optional number of seconds to a duration. One too
// long for a Duration (past ~292 years) is the longest Duration, so that
// the service refuses it against its TTL ceiling, rather than wrapping to
// a negative one.
func seconds(v *float64) *time.Duration {
	if v == nil {
		return nil
	}
	ns := math.Round(*v * float64(time.Second))
	d := time.Duration(math.MaxInt64)
	switch {
	case ns <= math.MinInt64:
		d = math.MinInt64
	case ns < math.MaxInt64:
		d = time.Duration(ns)
	}
	return &d
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func int64p(p *int) *int64 {
	if p == nil {
		return nil
	}
	v := int64(*p)
	return &v
}

func (s *server) CreateSandbox(ctx context.Context, req api.CreateSandboxRequestObject) (api.CreateSandboxResponseObject, error) {
	b := req.Body
	cr := sandbox.CreateRequest{
		Image:           deref(b.Image),
		TTL:             seconds(b.TTLS),
		IdleTimeout:     seconds(b.IdleTimeoutS),
		ReadyTimeout:    seconds(b.ReadyTimeoutS),
		Workdir:         deref(b.Workdir),
		Env:             b.Env,
		Files:           b.Files,
		Metadata:        b.Metadata,
		Entrypoint:      b.Entrypoint,
		Ports:           b.Ports,
		ProviderOptions: b.ProviderOptions,
		SnapshotID:      deref(b.SnapshotID),
		Volumes:         volumeRequests(b.Volumes),
		Group:           deref(b.Group),
		Hostname:        deref(b.Hostname),
		Aliases:         b.Aliases,
		CapAdd:          b.CapAdd,
	}
	var bad providers.InvalidFields
	if cr.Egress, cr.ProviderOptions, bad = createEgress(b.Network, b.ProviderOptions); len(bad) > 0 {
		return nil, bad
	}
	if r := b.Resources; r != nil {
		cr.Resources = providers.Resources{CPU: r.CPU, MemoryMiB: int64p(r.MemoryMib), DiskGiB: r.DiskGib, GPU: int64p(r.GPU), GPUType: r.GPUType}
	}
	if b.ShmSize != nil {
		// A number or a string, as provider_options.shm_size would be
		// decoded: the service reads both alike.
		raw, err := b.ShmSize.MarshalJSON()
		if err == nil {
			err = json.Unmarshal(raw, &cr.ShmSize)
		}
		if err != nil {
			return nil, providers.InvalidFields{{Field: "shm_size", Message: "must be a number of bytes or a size string"}}
		}
	}
	var out api.CreateSandbox201JSONResponse
	if b.Count == nil {
		ref, err := s.svc.Create(ctx, callerFrom(ctx), cr)
		if err != nil {
			return nil, err
		}
		return out, out.FromSandboxRef(s.ref(ref))
	}
	refs, failed, err := s.svc.CreateBatch(ctx, callerFrom(ctx), cr, *b.Count, deref(b.AllowPartial))
	if err != nil {
		return nil, err
	}
	batch := api.SandboxBatch{Sandboxes: make([]api.SandboxRef, len(refs)), Failed: []api.BatchFailure{}}
	for i, r := range refs {
		batch.Sandboxes[i] = s.ref(r)
	}
	for _, f := range failed {
		p := problemOf(ctx, s.log, f.Err, "POST /v1/sandboxes (batch)")
		batch.Failed = append(batch.Failed, api.BatchFailure{Index: f.Index, Problem: api.Problem{Type: p.Type, Title: p.Title, Status: p.Status, Detail: p.Detail, Code: p.Code, Errors: apiFieldErrors(p.Errors)}})
	}
	return out, out.FromSandboxBatch(batch)
}

func apiFieldErrors(fs []providers.FieldError) []api.FieldError {
	var out []api.FieldError
	for _, f := range fs {
		out = append(out, api.FieldError{Field: f.Field, Message: f.Message})
	}
	return out
}

func (s *server) ref(r sandbox.Ref) api.SandboxRef {
	extra := map[string]any{"lease_id": r.LeaseID}
	for k, v := range r.Extra {
		extra[k] = v
	}
	if !r.ExpiresAt.IsZero() {
		extra["expires_at"] = r.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return api.SandboxRef{
		ServerURL:    s.serverURL,
		SandboxID:    r.SandboxID,
		LeaseToken:   r.Token,
		ProviderName: r.Provider,
		Scope:        api.LeaseScope(r.Scope),
		Workdir:      r.Workdir,
		Extra:        extra,
	}
}

func info(i sandbox.Info) api.SandboxInfo {
	out := api.SandboxInfo{
		SandboxID:      i.ID,
		Status:         api.SandboxStatus(i.State),
		StatusReason:   nonEmpty(i.StateReason),
		ProviderName:   i.Provider,
		Workdir:        i.Workdir,
		CreatedAt:      i.CreatedAt.UTC(),
		LastActivityAt: i.LastActivity.UTC(),
		TTLS:           i.TTL.Seconds(),
		Metadata:       i.Metadata,
		Ports:          i.Ports,
		Extra:          i.Extra,
		Group:          nonEmpty(i.Group),
		Hostname:       cmp.Or(i.Hostname, sandbox.DefaultHostname),
		Aliases:        i.Aliases,
		NetworkAddress: nonEmpty(i.Address),
		Hosts:          i.Hosts,
		CapAdd:         i.CapAdd,
	}
	if out.Aliases == nil {
		out.Aliases = []string{}
	}
	if out.Hosts == nil {
		out.Hosts = map[string]string{}
	}
	if !i.ExpiresAt.IsZero() {
		t := i.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	if i.IdleTimeout > 0 {
		v := i.IdleTimeout.Seconds()
		out.IdleTimeoutS = &v
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if out.Ports == nil {
		out.Ports = []int{}
	}
	if i.Egress != nil || i.EgressStats != nil {
		// A copy: i.Extra is the record's.
		extra := make(map[string]any, len(i.Extra)+2)
		maps.Copy(extra, i.Extra)
		if i.Egress != nil {
			extra["egress"] = i.Egress
		}
		if i.EgressStats != nil {
			extra["egress_connections"] = i.EgressStats
		}
		out.Extra = extra
	}
	if out.Extra == nil {
		out.Extra = map[string]any{}
	}
	return out
}

func (s *server) ListSandboxes(ctx context.Context, req api.ListSandboxesRequestObject) (api.ListSandboxesResponseObject, error) {
	f := sandbox.ListFilter{Status: providers.State(deref(req.Params.Status)), Label: deref(req.Params.Label)}
	list, err := s.svc.List(ctx, callerFrom(ctx), f)
	if err != nil {
		return nil, err
	}
	out := api.SandboxList{Sandboxes: make([]api.SandboxInfo, len(list))}
	for i, v := range list {
		out.Sandboxes[i] = info(v)
	}
	return api.ListSandboxes200JSONResponse(out), nil
}

func (s *server) GetSandbox(ctx context.Context, req api.GetSandboxRequestObject) (api.GetSandboxResponseObject, error) {
	i, err := s.svc.Get(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	return api.GetSandbox200JSONResponse(info(i)), nil
}

func (s *server) GetSandboxStatus(ctx context.Context, req api.GetSandboxStatusRequestObject) (api.GetSandboxStatusResponseObject, error) {
	i, err := s.svc.Get(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	return api.GetSandboxStatus200JSONResponse{Status: api.SandboxStatus(i.State), StatusReason: nonEmpty(i.StateReason)}, nil
}

func (s *server) DeleteSandbox(ctx context.Context, req api.DeleteSandboxRequestObject) (api.DeleteSandboxResponseObject, error) {
	if err := s.svc.Delete(ctx, callerFrom(ctx), req.ID); err != nil {
		return nil, err
	}
	return api.DeleteSandbox200JSONResponse{Deleted: true}, nil
}

func (s *server) ExecCommand(ctx context.Context, req api.ExecCommandRequestObject) (api.ExecCommandResponseObject, error) {
	b := req.Body
	return execRun{s: s, ctx: ctx, id: req.ID, req: sandbox.ExecRequest{
		Command:            b.Command,
		Cwd:                deref(b.Cwd),
		Env:                b.Env,
		Timeout:            seconds(b.TimeoutS),
		User:               deref(b.User),
		StdinB64:           b.StdinB64,
		PreserveBackground: deref(b.PreserveBackgroundServices),
		KillOnDisconnect:   deref(b.KillOnDisconnect),
	}}, nil
}

func (s *server) UploadFile(ctx context.Context, req api.UploadFileRequestObject) (api.UploadFileResponseObject, error) {
	data, err := base64.StdEncoding.DecodeString(req.Body.ContentsB64)
	if err != nil {
		return nil, providers.InvalidFields{{Field: "contents_b64", Message: "is not valid base64"}}
	}
	if _, _, err := s.svc.WriteFile(ctx, callerFrom(ctx), req.ID, req.Body.TargetPath, strings.NewReader(string(data))); err != nil {
		return nil, err
	}
	return api.UploadFile200JSONResponse{}, nil
}

func (s *server) DownloadFile(ctx context.Context, req api.DownloadFileRequestObject) (api.DownloadFileResponseObject, error) {
	// The whole file is base64'd into one JSON body, so it must fit the same cap.
	rc, _, err := s.svc.ReadFile(ctx, callerFrom(ctx), req.ID, req.Params.RemotePath, s.maxUpload)
	if err != nil {
		return nil, err
	}
	return downloadBody{rc, s.replyTimeout}, nil
}

// downloadBody streams {"contents_b64": "..."} without building the
// base64 string in memory first. Visiting it closes the file; a client
// that takes nothing for stall has its connection closed.
type downloadBody struct {
	r     io.ReadCloser
	stall time.Duration
}

func (d downloadBody) VisitDownloadFileResponse(w http.ResponseWriter) error {
	defer d.r.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	pw := newProgressWriter(w, d.stall)
	io.WriteString(pw, `{"contents_b64":"`)
	enc := base64.NewEncoder(base64.StdEncoding, pw)
	if _, err := io.Copy(enc, d.r); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	if _, err := io.WriteString(pw, "\"}\n"); err != nil {
		return err
	}
	return pw.flush()
}

func (s *server) PutFile(ctx context.Context, req api.PutFileRequestObject) (api.PutFileResponseObject, error) {
	p, n, err := s.svc.WriteFile(ctx, callerFrom(ctx), req.ID, req.Params.Path, req.Body)
	if err != nil {
		return nil, err
	}
	return api.PutFile200JSONResponse{Path: p, Size: n}, nil
}

func (s *server) GetFile(ctx context.Context, req api.GetFileRequestObject) (api.GetFileResponseObject, error) {
	rc, size, err := s.svc.ReadFile(ctx, callerFrom(ctx), req.ID, req.Params.Path, 0)
	if err != nil {
		return nil, err
	}
	return api.GetFile200ApplicationOctetStreamResponse{Body: rc, Headers: api.GetFile200ResponseHeaders{ContentLength: &size}}, nil
}

func (s *server) StatFile(ctx context.Context, req api.StatFileRequestObject) (api.StatFileResponseObject, error) {
	p, fi, err := s.svc.StatFile(ctx, callerFrom(ctx), req.ID, req.Params.Path)
	if err != nil {
		return nil, err
	}
	return api.StatFile200JSONResponse(fileInfo(p, fi)), nil
}

func (s *server) ListFiles(ctx context.Context, req api.ListFilesRequestObject) (api.ListFilesResponseObject, error) {
	p, entries, truncated, err := s.svc.ListDir(ctx, callerFrom(ctx), req.ID, req.Params.Path)
	if err != nil {
		return nil, err
	}
	out := api.ListFiles200JSONResponse{Path: p, Entries: make([]api.FileInfo, len(entries)), Truncated: truncated}
	for i, fi := range entries {
		out.Entries[i] = fileInfo(path.Join(p, fi.Name), fi)
	}
	return out, nil
}

// fileInfo is fi, the file at the absolute path p, on the wire.
func fileInfo(p string, fi providers.FileInfo) api.FileInfo {
	perm := fi.Mode.Perm()
	if fi.Mode&fs.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if fi.Mode&fs.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if fi.Mode&fs.ModeSticky != 0 {
		perm |= 0o1000
	}
	out := api.FileInfo{
		Path: p, Name: fi.Name, Type: api.FileInfoType(fi.Type), Size: fi.Size,
		Mode: fmt.Sprintf("%04o", uint32(perm)), ModifiedAt: fi.ModTime,
	}
	if fi.Type == providers.FileSymlink {
		out.SymlinkTarget = &fi.Target
	}
	return out
}

func (s *server) CreateLease(ctx context.Context, req api.CreateLeaseRequestObject) (api.CreateLeaseResponseObject, error) {
	var scope sandbox.Scope
	var ttl *time.Duration
	if b := req.Body; b != nil {
		scope = sandbox.Scope(deref(b.Scope))
		ttl = seconds(b.TTLS)
	}
	ref, err := s.svc.Mint(ctx, callerFrom(ctx), req.ID, scope, ttl)
	if err != nil {
		return nil, err
	}
	return api.CreateLease201JSONResponse(s.ref(ref)), nil
}

func (s *server) ReleaseLease(ctx context.Context, req api.ReleaseLeaseRequestObject) (api.ReleaseLeaseResponseObject, error) {
	n, err := s.svc.Release(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	return api.ReleaseLease200JSONResponse{Released: true, RemainingLeases: n}, nil
}

func (s *server) RenewSandbox(ctx context.Context, req api.RenewSandboxRequestObject) (api.RenewSandboxResponseObject, error) {
	var ttl *time.Duration
	if req.Body != nil {
		ttl = seconds(req.Body.TTLS)
	}
	i, err := s.svc.Renew(ctx, callerFrom(ctx), req.ID, ttl)
	if err != nil {
		return nil, err
	}
	return api.RenewSandbox200JSONResponse(info(i)), nil
}

func (s *server) PauseSandbox(ctx context.Context, req api.PauseSandboxRequestObject) (api.PauseSandboxResponseObject, error) {
	i, err := s.svc.Pause(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	return api.PauseSandbox200JSONResponse(info(i)), nil
}

func (s *server) ResumeSandbox(ctx context.Context, req api.ResumeSandboxRequestObject) (api.ResumeSandboxResponseObject, error) {
	i, err := s.svc.Resume(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	return api.ResumeSandbox200JSONResponse(info(i)), nil
}

func (s *server) GetEndpoint(ctx context.Context, req api.GetEndpointRequestObject) (api.GetEndpointResponseObject, error) {
	e, err := s.svc.Endpoint(ctx, callerFrom(ctx), req.ID, req.Port)
	if err != nil {
		return nil, err
	}
	h := e.Headers
	if h == nil {
		h = map[string]string{}
	}
	return api.GetEndpoint200JSONResponse{Endpoint: e.URL, Headers: h}, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// nonEmpty is &s, or nil for "".
func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
