package sandbox

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"path"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// ExecRequest is one command as the client asked for it.
type ExecRequest struct {
	Command            string
	Cwd                string // "" = workdir; relative = against workdir
	Env                map[string]string
	Timeout            *time.Duration // nil = default (180 s)
	User               string
	StdinB64           *string
	PreserveBackground bool
	// KillOnDisconnect (Exec only): a cancelled ctx kills the command;
	// otherwise it runs on to its own timeout, held under its id.
	KillOnDisconnect bool
	// Started (Exec only), if set, is called with the command's id once
	// it runs, on Exec's goroutine, before Exec returns. Providers that
	// run no agent never call it.
	Started func(cid string)
}

// Error types of ExecResult.
const (
	ExecTimeout = "timeout" // the command ran out of time; its process group was killed
	ExecSandbox = "sandbox" // the sandbox runtime failed; the reason is in Stderr
)

// ExecResult is the outcome of one command. A non-zero exit is a result.
// Its output counts against the service's output budget until Release.
type ExecResult struct {
	Stdout, Stderr []byte
	ReturnCode     int
	ErrorType      string // "", ExecTimeout or ExecSandbox
	Duration       time.Duration
	Truncated      bool
	Usage          *providers.ExecUsage // nil where the provider cannot tell

	release func() // gives the output budget back; nil: holds none
}

// Release gives the room the result's output holds in the service's
// output budget back. The caller must call it once it no longer needs
// Stdout and Stderr (when the reply has been written); until then later
// execs get less. It may be called more than once, and on a zero
// ExecResult.
func (r ExecResult) Release() {
	if r.release != nil {
		r.release()
	}
}

// execGrace is how long past its timeout a command may take to be killed
// and reported before the service gives up on the provider.
const execGrace = 30 * time.Second

// Exec runs one command in the sandbox and waits for it. Each stream is
// capped at MaxExecOutput bytes, or less when the output budget of the
// sandbox creator's key (MaxExecOutputTotal) or the gateway's is short;
// either cut sets Truncated. While the
// command runs it holds room for two full streams in the budget; once it
// returns, only what its output takes, until the caller calls Release.
func (s *Service) Exec(ctx context.Context, c Caller, id string, req ExecRequest) (ExecResult, error) {
	var bad providers.InvalidFields
	timeout, stdin := s.checkExec(req, &bad)
	if err := bad.Err(); err != nil {
		return ExecResult{}, err
	}
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return ExecResult{}, err
	}
	end, err := s.begin(a.box)
	if err != nil {
		return ExecResult{}, err
	}
	defer end()
	done, err := s.execSlot(a.box)
	if err != nil {
		return ExecResult{}, err
	}
	defer done()

	start := time.Now()
	outcome := "error"
	defer func() {
		s.m.ExecTotal.WithLabelValues(outcome).Inc()
		s.m.ExecSeconds.Observe(time.Since(start).Seconds())
	}()
	maxOut, room := s.out.reserve(a.box.rec.Creator, s.opts.MaxExecOutput)
	if maxOut < s.opts.MaxExecOutput {
		s.log.Debug("exec output budget short", "sandbox", id, "max_output", maxOut)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+execGrace)
	defer cancel()
	pr := execFor(a.box, req, timeout, stdin, maxOut)
	pr.ID, pr.Retain, pr.KillOnDisconnect = newCommandID(), s.opts.CommandRetention, req.KillOnDisconnect
	if req.Started != nil {
		pr.Started = func() { req.Started(pr.ID) }
	}
	res, err := s.p.Exec(ctx, id, pr)
	if err != nil {
		room.release() // a failure's result holds a line at most
		out, err := s.execFailed(ctx, a.box, err)
		if err == nil {
			outcome = out.ErrorType
		}
		return out, err
	}
	room.keep(int64(len(res.Stdout) + len(res.Stderr)))
	out := ExecResult{
		Stdout:     res.Stdout,
		Stderr:     res.Stderr,
		ReturnCode: res.ExitCode,
		Duration:   res.Duration,
		Truncated:  res.Truncated,
		Usage:      res.Usage,
		release:    room.release,
	}
	switch {
	case res.TimedOut:
		out.ReturnCode, out.ErrorType = 125, ExecTimeout
		outcome = ExecTimeout
	case res.ExitCode != 0:
		outcome = "nonzero"
	default:
		outcome = "ok"
	}
	return out, nil
}

// checkExec validates req as Exec and StartCommand take it, adding each
// problem to bad, and returns its timeout (the default when unset) and
// its stdin (nil: none).
func (s *Service) checkExec(req ExecRequest, bad *providers.InvalidFields) (time.Duration, []byte) {
	if req.Command == "" {
		bad.Add("command", "must not be empty")
	}
	if req.Cwd != "" {
		if err := checkPath(req.Cwd); err != nil {
			bad.Add("cwd", "%s", err)
		}
	}
	timeout := s.opts.DefaultExecTimeout
	// 0, like null, is the default (the contract's minimum is 0; no exec
	// runs without a deadline).
	if req.Timeout != nil && *req.Timeout != 0 {
		if *req.Timeout < 0 {
			bad.Add("timeout_s", "must not be negative (0 or null: the default, %s)", s.opts.DefaultExecTimeout)
		}
		timeout = *req.Timeout
	}
	var stdin []byte
	if req.StdinB64 != nil {
		var err error
		if stdin, err = base64.StdEncoding.DecodeString(*req.StdinB64); err != nil {
			bad.Add("stdin_b64", "is not valid base64")
		}
	}
	return timeout, stdin
}

// execFor is req, checked by checkExec, as the provider takes it in
// sandbox b: cwd resolved against the workdir, env merged over the
// sandbox's.
func execFor(b *box, req ExecRequest, timeout time.Duration, stdin []byte, maxOut int) providers.ExecRequest {
	cwd := b.rec.Workdir
	if req.Cwd != "" {
		cwd = resolve(cwd, req.Cwd)
	}
	return providers.ExecRequest{
		Command:            req.Command,
		Cwd:                cwd,
		Env:                mergeEnv(b.rec.Env, req.Env),
		Timeout:            timeout,
		User:               req.User,
		Stdin:              stdin,
		PreserveBackground: req.PreserveBackground,
		MaxOutput:          maxOut,
	}
}

// execSlot counts one exec in flight against the concurrency limits, or
// refuses it with ErrTooMany. The returned func gives the slot back.
func (s *Service) execSlot(b *box) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case b.execs >= s.opts.MaxExecsPerSandbox:
		s.m.Refused.WithLabelValues("exec").Inc()
		return nil, providers.Errorf(providers.ErrTooMany, "sandbox %s already runs %d execs (the limit); retry when one finishes", b.rec.ID, b.execs)
	case s.execs >= s.opts.MaxExecs:
		s.m.Refused.WithLabelValues("exec").Inc()
		return nil, providers.Errorf(providers.ErrTooMany, "the gateway already runs %d execs (the limit); retry when one finishes", s.execs)
	}
	b.execs++
	s.execs++
	return func() {
		s.mu.Lock()
		b.execs--
		s.execs--
		s.mu.Unlock()
	}, nil
}

// execFailed turns a provider's exec error into the answer the client
// gets: the client's own cancellation and invalid input pass through; a
// sandbox known to be gone is 404/409; anything else is a runtime failure,
// reported as a 125/"sandbox" result.
func (s *Service) execFailed(ctx context.Context, b *box, err error) (ExecResult, error) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return ExecResult{}, err
	}
	switch providers.Kind(err) {
	case providers.ErrInvalid:
		return ExecResult{}, err
	case providers.ErrNotFound, providers.ErrConflict:
		// Let a stopped or vanished sandbox answer as such.
		s.refresh(context.WithoutCancel(ctx), b)
		s.mu.Lock()
		state, why := b.rec.State, b.rec.StateReason
		s.mu.Unlock()
		if state != providers.StateRunning {
			return ExecResult{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s%s", b.rec.ID, state, reason(why))
		}
	}
	s.log.Warn("exec: sandbox runtime failed", "sandbox", b.rec.ID, "err", err)
	return FailedResult(err), nil
}

// FailedResult is the result of a command whose sandbox runtime failed
// with err: 125, ExecSandbox, the reason in Stderr. It holds no budget.
func FailedResult(err error) ExecResult {
	return ExecResult{ReturnCode: 125, ErrorType: ExecSandbox, Stderr: []byte("sandbox error: " + providers.Message(err))}
}

// WriteFile streams r into path in the sandbox and returns the absolute
// path and the size written.
func (s *Service) WriteFile(ctx context.Context, c Caller, id, p string, r io.Reader) (string, int64, error) {
	a, end, abs, err := s.fileOp(ctx, c, id, p)
	if err != nil {
		return "", 0, err
	}
	defer end()
	n, err := s.p.WriteFile(ctx, id, abs, r)
	if err != nil {
		return "", 0, fileErr("write", p, err)
	}
	s.touch(a.box)
	return abs, n, nil
}

// ReadFile opens path in the sandbox for streaming; the caller closes it.
// limit > 0 refuses larger files with ErrTooLarge. The stream ends at the
// size returned, however much the sandbox sends (a file growing, an
// agent lying).
func (s *Service) ReadFile(ctx context.Context, c Caller, id, p string, limit int64) (io.ReadCloser, int64, error) {
	_, end, abs, err := s.fileOp(ctx, c, id, p)
	if err != nil {
		return nil, 0, err
	}
	rc, size, err := s.p.ReadFile(ctx, id, abs)
	if err != nil {
		end()
		return nil, 0, fileErr("read", p, err)
	}
	if limit > 0 && size > limit {
		rc.Close()
		end()
		return nil, 0, providers.Errorf(providers.ErrTooLarge, "%s is %d bytes; this route returns at most %d (use GET /files)", p, size, limit)
	}
	return &endCloser{ReadCloser: rc, r: io.LimitReader(rc, size), end: end}, size, nil
}

// StatFile describes the file at p in the sandbox (a symlink is not
// followed) and returns its absolute path with it.
func (s *Service) StatFile(ctx context.Context, c Caller, id, p string) (string, providers.FileInfo, error) {
	fl, err := s.fileLister()
	if err != nil {
		return "", providers.FileInfo{}, err
	}
	a, end, abs, err := s.fileOp(ctx, c, id, p)
	if err != nil {
		return "", providers.FileInfo{}, err
	}
	defer end()
	fi, err := fl.StatFile(ctx, id, abs)
	if err != nil {
		return "", providers.FileInfo{}, fileErr("stat", p, err)
	}
	s.touch(a.box)
	return abs, fi, nil
}

// ListDir lists the directory at p in the sandbox and returns its
// absolute path with the entries (see providers.FileLister).
func (s *Service) ListDir(ctx context.Context, c Caller, id, p string) (string, []providers.FileInfo, bool, error) {
	fl, err := s.fileLister()
	if err != nil {
		return "", nil, false, err
	}
	a, end, abs, err := s.fileOp(ctx, c, id, p)
	if err != nil {
		return "", nil, false, err
	}
	defer end()
	entries, truncated, err := fl.ListDir(ctx, id, abs)
	if err != nil {
		return "", nil, false, fileErr("list", p, err)
	}
	s.touch(a.box)
	return abs, entries, truncated, nil
}

// fileErr names the path in a provider's refusal ("no such file" alone
// does not say which), keeping its kind.
func fileErr(op, p string, err error) error {
	var f providers.InvalidFields
	if errors.As(err, &f) {
		return err
	}
	if k := providers.Kind(err); k != nil {
		return providers.Wrap(k, err, fmt.Sprintf("%s: %s", p, providers.Message(err)))
	}
	return fmt.Errorf("%s %s: %w", op, p, err)
}

// fileLister is the provider as a providers.FileLister, or ErrUnsupported.
func (s *Service) fileLister() (providers.FileLister, error) {
	if fl, ok := s.p.(providers.FileLister); ok {
		return fl, nil
	}
	return nil, providers.Errorf(providers.ErrUnsupported, "provider %s cannot describe or list files", s.p.Name())
}

// endCloser ends a request's activity hold when the stream is closed.
type endCloser struct {
	io.ReadCloser
	r   io.Reader // reads ReadCloser
	end func()
}

func (e *endCloser) Read(p []byte) (int, error) { return e.r.Read(p) }

func (e *endCloser) Close() error {
	err := e.ReadCloser.Close()
	e.end()
	return err
}

// fileOp validates p, authorizes, and marks a file request in flight.
func (s *Service) fileOp(ctx context.Context, c Caller, id, p string) (access, func(), string, error) {
	if err := checkPath(p); err != nil {
		return access{}, nil, "", providers.InvalidFields{{Field: "path", Message: err.Error()}}
	}
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return access{}, nil, "", err
	}
	end, err := s.begin(a.box)
	if err != nil {
		return access{}, nil, "", err
	}
	abs := resolve(a.box.rec.Workdir, p)
	if abs == "/" || path.Clean(abs) == "/" {
		end()
		return access{}, nil, "", providers.InvalidFields{{Field: "path", Message: "must name a file"}}
	}
	return a, end, abs, nil
}
