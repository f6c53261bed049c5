package handlers

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// apiCommand is c on the wire.
func apiCommand(c sandbox.Command) api.Command {
	out := api.Command{
		CommandID:     c.ID,
		Command:       c.Command,
		Running:       c.Running,
		ExitCode:      c.ExitCode,
		StartedAt:     c.StartedAt.UTC(),
		DurationMs:    c.DurationUS / 1000,
		CPUTimeS:      float64(c.CPUTimeUS) / 1e6,
		PeakMemoryMib: float64(c.PeakRSS) / (1 << 20),
		OomKilled:     c.OOMKilled,
		StdoutSize:    c.StdoutSize,
		StderrSize:    c.StderrSize,
		Truncated:     c.Truncated,
	}
	if c.FinishedAt != nil {
		t := c.FinishedAt.UTC()
		out.FinishedAt = &t
	}
	if c.TimedOut {
		t := api.ExecErrorTypeTimeout
		out.ErrorType = &t
	}
	return out
}

func (s *server) StartCommand(ctx context.Context, req api.StartCommandRequestObject) (api.StartCommandResponseObject, error) {
	b := req.Body
	cmd, err := s.svc.StartCommand(ctx, callerFrom(ctx), req.ID, sandbox.CommandRequest{
		ExecRequest: sandbox.ExecRequest{
			Command:            b.Command,
			Cwd:                deref(b.Cwd),
			Env:                b.Env,
			Timeout:            seconds(b.TimeoutS),
			User:               deref(b.User),
			StdinB64:           b.StdinB64,
			PreserveBackground: deref(b.PreserveBackgroundServices),
		},
		MaxOutput: deref(b.MaxOutputBytes),
	})
	if err != nil {
		return nil, err
	}
	if ctx.Value(eventStreamKey{}) != nil {
		return startedEvents{s: s, ctx: ctx, id: req.ID, cmd: apiCommand(cmd)}, nil
	}
	return api.StartCommand201JSONResponse(apiCommand(cmd)), nil
}

// eventStreamKey marks the context of a start whose request asked for an
// event stream (see askEvents).
type eventStreamKey struct{}

// askEvents marks, for a command's start, a request whose Accept asks for
// an event stream: the start is then answered with its events.
func askEvents(f api.StrictHandlerFunc, op string) api.StrictHandlerFunc {
	if op != "StartCommand" {
		return f
	}
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, req any) (any, error) {
		if acceptsEventStream(r.Header.Get("Accept")) {
			ctx = context.WithValue(ctx, eventStreamKey{}, true)
		}
		return f(ctx, w, r, req)
	}
}

// startedEvents answers a command's start with its event stream from
// offset 0, after a start event holding the command.
type startedEvents struct {
	s   *server
	ctx context.Context
	id  string
	cmd api.Command
}

func (se startedEvents) VisitStartCommandResponse(w http.ResponseWriter) error {
	err := se.s.commandEvents(se.ctx, w, se.id, se.cmd.CommandID, [2]int64{}, &se.cmd)
	if err != nil && se.ctx.Err() != nil {
		return nil // the client went away: the command runs on
	}
	return err
}

func (s *server) ListCommands(ctx context.Context, req api.ListCommandsRequestObject) (api.ListCommandsResponseObject, error) {
	list, err := s.svc.Commands(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	out := api.ListCommands200JSONResponse{Commands: make([]api.Command, len(list))}
	for i, c := range list {
		out.Commands[i] = apiCommand(c)
	}
	return out, nil
}

func (s *server) GetCommand(ctx context.Context, req api.GetCommandRequestObject) (api.GetCommandResponseObject, error) {
	cmd, err := s.svc.Command(ctx, callerFrom(ctx), req.ID, req.Cid)
	if err != nil {
		return nil, err
	}
	return api.GetCommand200JSONResponse(apiCommand(cmd)), nil
}

func (s *server) DeleteCommand(ctx context.Context, req api.DeleteCommandRequestObject) (api.DeleteCommandResponseObject, error) {
	if err := s.svc.DeleteCommand(ctx, callerFrom(ctx), req.ID, req.Cid); err != nil {
		return nil, err
	}
	return api.DeleteCommand200JSONResponse{Deleted: true}, nil
}

func (s *server) SignalCommand(ctx context.Context, req api.SignalCommandRequestObject) (api.SignalCommandResponseObject, error) {
	if err := s.svc.SignalCommand(ctx, callerFrom(ctx), req.ID, req.Cid, req.Body.Signal); err != nil {
		return nil, err
	}
	return api.SignalCommand200JSONResponse{}, nil
}

func (s *server) WaitCommand(ctx context.Context, req api.WaitCommandRequestObject) (api.WaitCommandResponseObject, error) {
	return waitRun{s: s, ctx: ctx, id: req.ID, cid: req.Cid, timeout: seconds(req.Params.TimeoutS)}, nil
}

// waitRun waits for a command as its reply is written: answered within a
// heartbeat period, it is 200 with the result (written as execReply
// writes it) or 202 with the command; later, the status 200 goes out at
// the first heartbeat, a space follows every period, and the answer, the
// result or the command (running), ends that 200. An error after the
// status is a problem body in the 200 (clients tell the bodies apart by
// their fields).
type waitRun struct {
	s       *server
	ctx     context.Context
	id, cid string
	timeout *time.Duration
}

var _ api.WaitCommandResponseObject = waitRun{}

func (wr waitRun) VisitWaitCommandResponse(w http.ResponseWriter) error {
	pw := newProgressWriter(w, wr.s.replyTimeout)
	hb := startHeartbeat(pw, wr.s.heartbeat, []byte(" "), func() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
	})
	cmd, res, err := wr.s.svc.WaitCommand(wr.ctx, callerFrom(wr.ctx), wr.id, wr.cid, wr.timeout)
	committed := hb.end()
	if res != nil {
		defer res.Release()
	}
	if !committed {
		switch {
		case err != nil:
			return err
		case res != nil:
			return execReply{*res, wr.s.replyTimeout}.VisitExecCommandResponse(w)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		return json.NewEncoder(pw).Encode(apiCommand(cmd))
	}
	switch {
	case err != nil && wr.ctx.Err() != nil:
		wr.s.log.Debug("client gone during a command's wait", "sandbox", wr.id, "err", err)
		return nil
	case err != nil:
		err = json.NewEncoder(pw).Encode(problemOf(wr.ctx, wr.s.log, err, "GET "+wr.id+" wait"))
	case res != nil:
		err = writeExecResult(pw, *res)
	default:
		err = json.NewEncoder(pw).Encode(apiCommand(cmd))
	}
	if err != nil {
		return err
	}
	return pw.flush()
}

// readCommandOutput is GET /v1/sandboxes/{id}/commands/{cid}/output,
// mounted beside the generated router (the validator has checked its
// parameters against the contract; the SSE form needs the request's
// Accept and Last-Event-ID).
func (s *server) readCommandOutput(w http.ResponseWriter, r *http.Request) {
	id, cid := chi.URLParam(r, "id"), chi.URLParam(r, "cid")
	q := r.URL.Query()
	sse := acceptsEventStream(r.Header.Get("Accept"))
	var bad providers.InvalidFields
	var since [2]int64
	if v := r.Header.Get("Last-Event-ID"); sse && v != "" {
		var err error
		if since, err = parseOffsets(v, true); err != nil {
			bad.Add("header.Last-Event-ID", "%s", err)
		}
	} else if v := q.Get("since"); v != "" {
		var err error
		if since, err = parseOffsets(v, sse); err != nil {
			bad.Add("query.since", "%s", err)
		}
	}
	stream := q.Get("stream")
	if stream != "" && stream != "stdout" && stream != "stderr" {
		bad.Add("query.stream", "must be stdout or stderr")
	}
	if err := bad.Err(); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	var err error
	if sse {
		err = s.commandEvents(r.Context(), w, id, cid, since, nil)
	} else {
		err = s.commandBytes(w, r, id, cid, stream != "stderr", since[0])
	}
	switch {
	case err != nil && r.Context().Err() != nil && started(w):
		s.log.Debug("client gone during a command's output", "sandbox", id, "err", err)
	case err != nil:
		s.responseError(w, r, err)
	}
}

// acceptsEventStream reports whether an Accept header asks for SSE.
func acceptsEventStream(accept string) bool {
	for part := range strings.SplitSeq(accept, ",") {
		mt, _, _ := strings.Cut(part, ";")
		if strings.EqualFold(strings.TrimSpace(mt), "text/event-stream") {
			return true
		}
	}
	return false
}

// parseOffsets reads since: one offset (for both streams), or, when pair
// is allowed, "O,E" (stdout's and stderr's).
func parseOffsets(v string, pair bool) ([2]int64, error) {
	o, e, two := strings.Cut(v, ",")
	if two && !pair {
		return [2]int64{}, errors.New("must be a non-negative integer")
	}
	n, err := parseSince(o)
	if err != nil {
		return [2]int64{}, err
	}
	if !two {
		return [2]int64{n, n}, nil
	}
	m, err := parseSince(e)
	if err != nil {
		return [2]int64{}, err
	}
	return [2]int64{n, m}, nil
}

// commandBytes writes one stream of a command from since to its end as
// the read begins, raw, the next offset and whether it runs in headers.
func (s *server) commandBytes(w http.ResponseWriter, r *http.Request, id, cid string, stdout bool, since int64) error {
	pw := newProgressWriter(w, s.replyTimeout)
	_, err := s.svc.ReadCommandStream(r.Context(), callerFrom(r.Context()), id, cid, stdout, since, func(c sandbox.Command) error {
		end := c.StdoutSize
		if !stdout {
			end = c.StderrSize
		}
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Length", strconv.FormatInt(end-since, 10))
		h.Set("X-Next-Offset", strconv.FormatInt(end, 10))
		h.Set("X-Command-Running", strconv.FormatBool(c.Running))
		w.WriteHeader(http.StatusOK)
		return nil
	}, func(o sandbox.Output) error {
		_, err := pw.Write(o.Data)
		return err
	})
	if err != nil {
		return err
	}
	return pw.flush()
}

// commandEvents writes both streams of a command from since as they come,
// then its end, as server-sent events (see the contract), with a
// keepalive comment every heartbeat period of quiet. A start, if given,
// is the first event (the command just started from the same request).
func (s *server) commandEvents(ctx context.Context, w http.ResponseWriter, id, cid string, since [2]int64, start *api.Command) error {
	pw := newProgressWriter(w, s.replyTimeout)
	var hb *heartbeat
	defer func() {
		if hb != nil {
			hb.end()
		}
	}()
	off := since
	var ev []byte
	event := func(name string, data []byte, b64 bool) error {
		ev = append(ev[:0], "event: "...)
		ev = append(ev, name...)
		ev = append(ev, "\nid: "...)
		ev = strconv.AppendInt(ev, off[0], 10)
		ev = append(ev, ',')
		ev = strconv.AppendInt(ev, off[1], 10)
		ev = append(ev, "\ndata: "...)
		if b64 {
			ev = base64.StdEncoding.AppendEncode(ev, data)
		} else {
			ev = append(ev, data...)
		}
		ev = append(ev, "\n\n"...)
		return hb.write(ev)
	}
	fin, err := s.svc.ReadCommand(ctx, callerFrom(ctx), id, cid, since, true, func(sandbox.Command) error {
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Accel-Buffering", "no") // nginx: do not hold events back
		if start != nil {
			h.Set("X-Command-Id", cid)
		}
		w.WriteHeader(http.StatusOK)
		if start == nil {
			if err := pw.flush(); err != nil {
				return err
			}
		}
		hb = startHeartbeat(pw, s.heartbeat, []byte(": keepalive\n\n"), nil)
		if start == nil {
			return nil
		}
		data, err := json.Marshal(start)
		if err != nil {
			return err
		}
		return event("start", data, false) // flushed with the status
	}, func(o sandbox.Output) error {
		name, i := "stdout", 0
		if !o.Stdout {
			name, i = "stderr", 1
		}
		off[i] = o.Offset + int64(len(o.Data))
		return event(name, o.Data, true)
	})
	if err != nil {
		return err
	}
	data, err := json.Marshal(apiCommand(fin))
	if err != nil {
		return err
	}
	return event("exit", data, false)
}
