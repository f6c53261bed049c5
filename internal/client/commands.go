package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/api"
)

// StartCommand starts a durable command (POST .../commands) and returns
// it as it runs: its output and result are then read by its id, from any
// connection, for as long as the gateway retains them.
func (c *Client) StartCommand(ctx context.Context, sandboxID string, req api.CommandRequest) (api.Command, error) {
	var res api.Command
	err := c.do(ctx, http.MethodPost, c.sandboxPath(sandboxID, "commands"), req, &res)
	return res, err
}

// Command describes command cid.
func (c *Client) Command(ctx context.Context, sandboxID, cid string) (api.Command, error) {
	var res api.Command
	err := c.do(ctx, http.MethodGet, c.sandboxPath(sandboxID, "commands", cid), nil, &res)
	return res, err
}

// DeleteCommand kills command cid's tree and forgets it.
func (c *Client) DeleteCommand(ctx context.Context, sandboxID, cid string) error {
	var res map[string]any
	return c.do(ctx, http.MethodDelete, c.sandboxPath(sandboxID, "commands", cid), nil, &res)
}

// FollowOptions tune FollowCommand.
type FollowOptions struct {
	// Stdout and Stderr get the command's output as it arrives, each byte
	// once.
	Stdout, Stderr io.Writer
	// Retries bounds the reconnections in a row that bring nothing new
	// (default 8); Backoff is the first delay between them (default
	// 200 ms, doubling to 5 s).
	Retries int
	Backoff time.Duration
	// Reconnecting, if set, is told of each reconnection and why.
	Reconnecting func(attempt int, err error)
	// Started, if set, gets the command as soon as RunCommand started
	// it (its id: for a signal or delete meanwhile).
	Started func(api.Command)
}

// RunCommand starts a durable command and follows it in the same request
// (POST .../commands asking for an event stream: one round trip to the
// first byte), then as FollowCommand does: its output goes to o.Stdout and
// o.Stderr as it is written, a dropped stream is re-opened where it
// stopped, and the command is returned once it ended. If the request
// fails before the command started, nothing was started.
func (c *Client) RunCommand(ctx context.Context, sandboxID string, req api.CommandRequest, o FollowOptions) (api.Command, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return api.Command{}, err
	}
	f := newFollower(o)
	end, err := f.once(ctx, c, func() (*http.Request, error) {
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+c.sandboxPath(sandboxID, "commands"), bytes.NewReader(body))
		if err == nil {
			r.Header.Set("Content-Type", "application/json")
		}
		return r, err
	})
	if err == nil || f.cid == "" {
		return end, err
	}
	return c.follow(ctx, sandboxID, f, err)
}

// FollowCommand copies command cid's output from its start to
// o.Stdout and o.Stderr as the command writes it, over the gateway's
// event stream, and returns the command once it ended. A dropped stream
// (a proxy that cuts it, a gateway restart) is re-opened from the last
// offsets received (Last-Event-ID), so nothing is lost or repeated.
func (c *Client) FollowCommand(ctx context.Context, sandboxID, cid string, o FollowOptions) (api.Command, error) {
	f := newFollower(o)
	f.cid = cid
	return c.follow(ctx, sandboxID, f, nil)
}

// follow re-opens f's command's event stream from where it stopped until
// it ends; err, if set, is why the last stream stopped.
func (c *Client) follow(ctx context.Context, sandboxID string, f *follower, err error) (api.Command, error) {
	o, cid := f.o, f.cid
	for fails := 0; ; {
		before := f.lastID
		if err == nil {
			var end api.Command
			end, err = f.once(ctx, c, func() (*http.Request, error) {
				return http.NewRequestWithContext(ctx, http.MethodGet, c.base+c.sandboxPath(sandboxID, "commands", cid, "output"), nil)
			})
			if err == nil {
				return end, nil
			}
		}
		var gerr *Error
		if ctx.Err() != nil || errors.As(err, &gerr) && gerr.Status/100 == 4 || errors.Is(err, errLocal) {
			return api.Command{}, err
		}
		if f.lastID != before {
			fails = 0
		}
		if fails++; fails > o.Retries {
			return api.Command{}, fmt.Errorf("command %s: the event stream failed %d times in a row: %w", cid, fails-1, err)
		}
		if o.Reconnecting != nil {
			o.Reconnecting(fails, err)
		}
		t := time.NewTimer(backoff(fails-1, o.Backoff, 5*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return api.Command{}, ctx.Err()
		case <-t.C:
		}
		err = nil
	}
}

// errLocal marks a failed write to the caller's writers.
var errLocal = errors.New("write output")

// follower is the state kept across one command's event streams.
type follower struct {
	o      FollowOptions
	cid    string // the command's id, once known
	lastID string // "stdout offset,stderr offset" after the last event
}

func newFollower(o FollowOptions) *follower {
	if o.Retries <= 0 {
		o.Retries = 8
	}
	if o.Backoff <= 0 {
		o.Backoff = 200 * time.Millisecond
	}
	return &follower{o: o, lastID: "0,0"}
}

// once reads one event stream, the answer to the request newReq makes,
// until the exit event (the command's end) or until it breaks.
func (f *follower) once(ctx context.Context, c *Client, newReq func() (*http.Request, error)) (api.Command, error) {
	req, err := newReq()
	if err != nil {
		return api.Command{}, err
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", f.lastID)
	req.Header.Set("X-Sandbox-Lease", c.token)
	res, err := c.http.Do(req)
	if err != nil {
		return api.Command{}, err
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		return api.Command{}, problem(res)
	}
	if f.cid == "" {
		f.cid = res.Header.Get("X-Command-Id")
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	var event, id string
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		if line != "" {
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				event = value
			case "id":
				id = value
			case "data":
				if data.Len() > 0 {
					data.WriteByte('\n')
				}
				data.WriteString(value)
			}
			continue
		}
		// A blank line ends an event.
		switch event {
		case "stdout", "stderr":
			p, err := base64.StdEncoding.DecodeString(data.String())
			if err != nil {
				return api.Command{}, fmt.Errorf("command %s: an output event that is not base64: %w", f.cid, err)
			}
			w := f.o.Stdout
			if event == "stderr" {
				w = f.o.Stderr
			}
			if w != nil {
				if _, err := w.Write(p); err != nil {
					return api.Command{}, fmt.Errorf("%w: %v", errLocal, err)
				}
			}
		case "start":
			var start api.Command
			if err := json.Unmarshal([]byte(data.String()), &start); err != nil {
				return api.Command{}, fmt.Errorf("command %s: a start event that is not a command: %w", f.cid, err)
			}
			f.cid = start.CommandID
			if f.o.Started != nil {
				f.o.Started(start)
			}
		case "exit":
			var end api.Command
			if err := json.Unmarshal([]byte(data.String()), &end); err != nil {
				return api.Command{}, fmt.Errorf("command %s: an exit event that is not a command: %w", f.cid, err)
			}
			return end, nil
		}
		if id != "" {
			f.lastID = id
		}
		event, id = "", ""
		data.Reset()
	}
	if err := sc.Err(); err != nil {
		return api.Command{}, err
	}
	return api.Command{}, io.ErrUnexpectedEOF
}
