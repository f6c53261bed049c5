// Package fake is an in-memory provider for tests of the layers above the
// providers: it keeps files in maps and answers exec with a function the
// test chooses; the point of it is to be fast and fully controllable
// (failures, states, timing). Its terminal sessions alone are real: each
// sandbox gets an agent in the test's process (agent.go).
package fake

import (
	"bytes"
	"context"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// ExecFunc answers one exec.
type ExecFunc func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error)

// Provider is the fake. Its zero value is not usable; call New.
type Provider struct {
	// Exec answers exec requests; default: echo the command on stdout,
	// exit code 0.
	ExecFunc ExecFunc
	// CreateErr, when set, makes Create fail with it.
	CreateErr error
	// CreateCheck, when set, is asked first by every Create (unlocked):
	// an error fails that create.
	CreateCheck func(spec providers.CreateSpec) error
	// PingErr, when set, makes Ping fail with it.
	PingErr error
	// OnDelete, when set, is called (unlocked) by every Delete that
	// removed a sandbox, before it returns: what happens meanwhile
	// elsewhere (a cluster's garbage collector removing what the sandbox
	// owned, another replica's sync).
	OnDelete func(id string)

	mu    sync.Mutex
	boxes map[string]*sandbox
	snaps map[string]*sandbox // the files and dirs of each snapshot
}

type sandbox struct {
	state   providers.State
	workdir string
	files   map[string][]byte
	dirs    map[string]bool
	agent   *host // see Agent; nil until first used
}

var (
	_ providers.Provider    = (*Provider)(nil)
	_ providers.Pauser      = (*Provider)(nil)
	_ providers.Snapshotter = (*Provider)(nil)
)

// New returns an empty fake provider.
func New() *Provider { return &Provider{boxes: map[string]*sandbox{}, snaps: map[string]*sandbox{}} }

func (p *Provider) Name() string { return "fake" }

func (p *Provider) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if p.CreateCheck != nil {
		if err := p.CreateCheck(spec); err != nil {
			return providers.Sandbox{}, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.CreateErr != nil {
		return providers.Sandbox{}, p.CreateErr
	}
	for k := range spec.Options {
		return providers.Sandbox{}, providers.Errorf(providers.ErrInvalid, "provider_options: unknown key %q", k)
	}
	sb := &sandbox{state: providers.StateRunning, workdir: spec.Workdir, files: map[string][]byte{}, dirs: map[string]bool{spec.Workdir: true}}
	if spec.Snapshot != "" {
		sn := p.snaps[spec.Snapshot]
		if sn == nil {
			return providers.Sandbox{}, providers.Errorf(providers.ErrInvalid, "no snapshot %s", spec.Snapshot)
		}
		sb.files, sb.dirs = maps.Clone(sn.files), maps.Clone(sn.dirs)
		sb.dirs[spec.Workdir] = true
	}
	p.boxes[spec.ID] = sb
	return providers.Sandbox{ID: spec.ID, Workdir: spec.Workdir, Extra: map[string]any{"fake": true}}, nil
}

// Snapshot copies sandbox id's files and directories as snapshot sid.
func (p *Provider) Snapshot(ctx context.Context, id, sid string) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.get(id)
	if err != nil {
		return 0, err
	}
	var size int64
	for _, f := range b.files {
		size += int64(len(f))
	}
	files := make(map[string][]byte, len(b.files))
	for k, v := range b.files {
		files[k] = slices.Clone(v)
	}
	p.snaps[sid] = &sandbox{files: files, dirs: maps.Clone(b.dirs)}
	return size, nil
}

// DeleteSnapshot forgets snapshot sid.
func (p *Provider) DeleteSnapshot(ctx context.Context, sid string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.snaps[sid] == nil {
		return providers.Errorf(providers.ErrNotFound, "no snapshot %s", sid)
	}
	delete(p.snaps, sid)
	return nil
}

// Snapshots are the snapshots the fake holds.
func (p *Provider) Snapshots() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.snaps))
}

func (p *Provider) get(id string) (*sandbox, error) {
	b := p.boxes[id]
	if b == nil {
		return nil, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	if b.state != providers.StateRunning {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, b.state)
	}
	return b, nil
}

func (p *Provider) Exec(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
	p.mu.Lock()
	_, err := p.get(id)
	f := p.ExecFunc
	p.mu.Unlock()
	if err != nil {
		return providers.ExecResult{}, err
	}
	if f != nil {
		return f(ctx, id, req)
	}
	return providers.ExecResult{Stdout: []byte(req.Command), Duration: time.Millisecond}, nil
}

func (p *Provider) WriteFile(ctx context.Context, id, path string, r io.Reader) (int64, error) {
	var buf bytes.Buffer
	n, err := io.Copy(&buf, r)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.get(id)
	if err != nil {
		return 0, err
	}
	if b.dirs[path] {
		return 0, providers.Errorf(providers.ErrInvalid, "%s is a directory", path)
	}
	b.files[path] = buf.Bytes()
	for d := parent(path); d != "/"; d = parent(d) {
		b.dirs[d] = true
	}
	return n, nil
}

func parent(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

func (p *Provider) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.get(id)
	if err != nil {
		return nil, 0, err
	}
	if b.dirs[path] {
		return nil, 0, providers.Errorf(providers.ErrInvalid, "%s is a directory", path)
	}
	data, ok := b.files[path]
	if !ok {
		return nil, 0, providers.Errorf(providers.ErrNotFound, "%s: no such file", path)
	}
	return io.NopCloser(bytes.NewReader(data)), int64(len(data)), nil
}

func (p *Provider) Status(ctx context.Context, id string) (providers.State, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.boxes[id]
	if b == nil {
		return "", providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	return b.state, nil
}

// Stop makes sandbox id stop as if its process died (its agent too).
func (p *Provider) Stop(id string) {
	p.mu.Lock()
	var h *host
	if b := p.boxes[id]; b != nil {
		b.state = providers.StateStopped
		h = b.dropAgent()
	}
	p.mu.Unlock()
	endAgents(h)
}

// Vanish forgets sandbox id as if the backend lost it.
func (p *Provider) Vanish(id string) {
	p.mu.Lock()
	h := p.drop(id)
	p.mu.Unlock()
	endAgents(h)
}

// drop forgets sandbox id and returns its agent for endAgents. Caller
// holds p.mu.
func (p *Provider) drop(id string) *host {
	b := p.boxes[id]
	if b == nil {
		return nil
	}
	delete(p.boxes, id)
	return b.dropAgent()
}

// Adopt makes the fake hold a sandbox it did not create (an orphan).
func (p *Provider) Adopt(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.boxes[id] = &sandbox{state: providers.StateRunning, files: map[string][]byte{}, dirs: map[string]bool{}}
}

// Has reports whether the fake holds sandbox id.
func (p *Provider) Has(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.boxes[id] != nil
}

func (p *Provider) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	if p.boxes[id] == nil {
		p.mu.Unlock()
		return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	h := p.drop(id)
	p.mu.Unlock()
	endAgents(h)
	if p.OnDelete != nil {
		p.OnDelete(id)
	}
	return nil
}

func (p *Provider) List(ctx context.Context) ([]providers.Owned, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []providers.Owned
	for id, b := range p.boxes {
		out = append(out, providers.Owned{ID: id, State: b.state})
	}
	return out, nil
}

func (p *Provider) Ping(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.PingErr
}

// Close ends every sandbox's agent (their sessions' processes are
// killed); the sandboxes stay. A test that used terminal sessions must
// call it.
func (p *Provider) Close() error {
	p.mu.Lock()
	var hs []*host
	for _, b := range p.boxes {
		hs = append(hs, b.dropAgent())
	}
	p.mu.Unlock()
	endAgents(hs...)
	return nil
}

func (p *Provider) Pause(ctx context.Context, id string) error {
	return p.setState(id, providers.StateRunning, providers.StatePaused)
}

func (p *Provider) Resume(ctx context.Context, id string) error {
	return p.setState(id, providers.StatePaused, providers.StateRunning)
}

func (p *Provider) setState(id string, from, to providers.State) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.boxes[id]
	if b == nil {
		return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	if b.state != from {
		return providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, b.state)
	}
	b.state = to
	return nil
}
