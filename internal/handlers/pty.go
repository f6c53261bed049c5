package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/pty"
)

func (s *server) CreatePtySession(ctx context.Context, req api.CreatePtySessionRequestObject) (api.CreatePtySessionResponseObject, error) {
	spec := providers.ProcessSpec{TTY: true}
	at := pty.StartAtAttach // no mode named: the first attach picks it
	if b := req.Body; b != nil {
		spec.Command = deref(b.Command)
		spec.Cwd = deref(b.Cwd)
		spec.Env = b.Env
		spec.User = deref(b.User)
		if b.Pty != nil {
			spec.TTY, at = *b.Pty, pty.StartNow
		}
		// The contract bounds both to 1..65535.
		spec.Rows = uint16(deref(b.Rows))
		spec.Cols = uint16(deref(b.Cols))
	}
	info, err := s.pty.Create(ctx, callerFrom(ctx), req.ID, spec, at)
	if err != nil {
		return nil, err
	}
	return api.CreatePtySession201JSONResponse{SessionID: info.ID}, nil
}

func ptySession(i pty.Info) api.PtySession {
	return api.PtySession{
		SessionID:    i.ID,
		Running:      i.Running,
		OutputOffset: i.OutputOffset,
		ExitCode:     i.ExitCode,
		Mode:         api.PtyMode(i.Mode),
		Attached:     i.Attached,
		CreatedAt:    i.CreatedAt.UTC(),
	}
}

func (s *server) ListPtySessions(ctx context.Context, req api.ListPtySessionsRequestObject) (api.ListPtySessionsResponseObject, error) {
	list, err := s.pty.List(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	out := api.PtySessionList{Sessions: make([]api.PtySession, len(list))}
	for i, v := range list {
		out.Sessions[i] = ptySession(v)
	}
	return api.ListPtySessions200JSONResponse(out), nil
}

func (s *server) GetPtySession(ctx context.Context, req api.GetPtySessionRequestObject) (api.GetPtySessionResponseObject, error) {
	i, err := s.pty.Get(ctx, callerFrom(ctx), req.ID, req.Sid)
	if err != nil {
		return nil, err
	}
	return api.GetPtySession200JSONResponse(ptySession(i)), nil
}

func (s *server) DeletePtySession(ctx context.Context, req api.DeletePtySessionRequestObject) (api.DeletePtySessionResponseObject, error) {
	if err := s.pty.Delete(ctx, callerFrom(ctx), req.ID, req.Sid); err != nil {
		return nil, err
	}
	return api.DeletePtySession200JSONResponse{Deleted: true}, nil
}

// attachPty is GET /v1/sandboxes/{id}/pty/{sid}/ws, mounted beside the
// generated router (the validator has checked its parameters against the
// contract). A browser's lease may come as the subprotocol
// sandgate.lease.<token> (echoed back) or ?lease=, after the headers (see
// credentials).
func (s *server) attachPty(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := pty.AttachRequest{
		SandboxID: chi.URLParam(r, "id"),
		SessionID: chi.URLParam(r, "sid"),
		Takeover:  q.Get("takeover") == "1" || q.Get("takeover") == "true",
	}
	switch q.Get("pty") {
	case "0":
		req.PTY = new(bool)
	case "1":
		req.PTY = new(bool)
		*req.PTY = true
	}
	var bad providers.InvalidFields
	if v := q.Get("since"); v != "" {
		n, err := parseSince(v)
		if err != nil {
			bad.Add("query.since", "%s", err)
		}
		req.Since = n
	}
	if err := bad.Err(); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	req.Subprotocol = leaseProtocol(r)
	if err := s.pty.Attach(w, r, callerFrom(r.Context()), req); err != nil {
		writeError(w, r, s.log, err)
	}
}

// parseSince reads the since query parameter: a byte offset, decimal
// digits only (no sign, no spaces), at most 2^63-1.
func parseSince(v string) (int64, error) {
	if v == "" || strings.TrimLeft(v, "0123456789") != "" {
		return 0, errors.New("must be a non-negative integer")
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errors.New("must be a non-negative integer below 2^63")
	}
	return n, nil
}
