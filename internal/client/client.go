// Package client is a small Go client of the gateway for the command-line
// tools (`gateway shell`, `gateway exec`): one-shot exec, terminal
// sessions, and an attachment that re-attaches after a dropped connection
// without losing or repeating a byte (SPEC §7).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/sandgate/sandgate/internal/api"
)

// Client talks to one gateway with one credential. Its methods are safe for
// concurrent use.
type Client struct {
	base  string // scheme://host[:port][/prefix], without /v1
	token string
	http  *http.Client
}

// New returns a client of the gateway at baseURL (http or https, with or
// without the trailing /v1) that authenticates with token (a lease, or an
// API key), sent in the X-Sandbox-Lease header. hc nil: a default client
// (no overall timeout: exec may take as long as its timeout_s).
func New(baseURL, token string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("gateway URL %q: want http(s)://host[:port]", baseURL)
	}
	if hc == nil {
		hc = &http.Client{}
	}
	base := strings.TrimSuffix(strings.TrimSuffix(u.String(), "/"), "/v1")
	return &Client{base: base, token: token, http: hc}, nil
}

// Error is a refusal from the gateway (its problem+json body).
type Error struct {
	Status int
	Code   string
	Detail string
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("gateway answered %d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("gateway answered %d: %s", e.Status, e.Detail)
}

// problem reads a refusal's body into an *Error.
func problem(res *http.Response) error {
	e := &Error{Status: res.StatusCode}
	var p api.Problem
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if json.Unmarshal(body, &p) == nil {
		e.Code, e.Detail = p.Code, p.Detail
	}
	return e
}

func (c *Client) sandboxPath(id string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}

// do sends a JSON request with the token as a lease and decodes a 2xx
// answer into out.
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	return c.send(ctx, method, path, "X-Sandbox-Lease", c.token, in, out)
}

// doKey is do for the routes of an API key (volumes): the token goes as
// Authorization: Bearer.
func (c *Client) doKey(ctx context.Context, method, path string, in, out any) error {
	return c.send(ctx, method, path, "Authorization", "Bearer "+c.token, in, out)
}

func (c *Client) send(ctx context.Context, method, path, authHeader, auth string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.authorize(req, authHeader, auth)
	return c.roundTrip(req, out)
}

// authorize sets the credential header, unless the client has no token (a
// gateway on loopback without API keys takes anonymous creates).
func (c *Client) authorize(req *http.Request, header, value string) {
	if c.token != "" {
		req.Header.Set(header, value)
	}
}

// roundTrip sends req and decodes a 2xx answer into out.
func (c *Client) roundTrip(req *http.Request, out any) error {
	if req.Header.Get("X-Sandbox-Lease") == "" && req.Header.Get("Authorization") == "" {
		c.authorize(req, "X-Sandbox-Lease", c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		return problem(res)
	}
	return json.NewDecoder(res.Body).Decode(out)
}

// Exec runs one command in a sandbox and returns its result; a non-zero
// exit is a result, not an error.
func (c *Client) Exec(ctx context.Context, sandboxID string, req api.ExecRequest) (api.ExecResult, error) {
	var res api.ExecResult
	err := c.do(ctx, http.MethodPost, c.sandboxPath(sandboxID, "exec"), req, &res)
	return res, err
}

// CreateSession starts a terminal session (the sandbox's interactive shell
// when req.Command is nil) and returns its id.
func (c *Client) CreateSession(ctx context.Context, sandboxID string, req api.PtyCreateRequest) (string, error) {
	var res api.PtyCreated
	err := c.do(ctx, http.MethodPost, c.sandboxPath(sandboxID, "pty"), req, &res)
	return res.SessionID, err
}

// wsURL is the attach URL of a session, with since and takeover.
func (c *Client) wsURL(sandboxID, sessionID string, since int64, takeover bool) string {
	u := c.base + c.sandboxPath(sandboxID, "pty", sessionID, "ws") + fmt.Sprintf("?since=%d", since)
	if takeover {
		u += "&takeover=1"
	}
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		return "wss://" + rest
	}
	return "ws://" + strings.TrimPrefix(u, "http://")
}
