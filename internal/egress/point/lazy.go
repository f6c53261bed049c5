package point

import (
	"errors"
	"sync"
)

// ErrClosed is Lazy.Get's error once Close was called.
var ErrClosed = errors.New("egress: the point is closed")

// Lazy is a provider's egress point, made on first use: the router
// namespace and its servers exist only once a sandbox has a policy. The
// zero value is not usable: set Options first (NewLazy). Safe for
// concurrent use.
type Lazy struct {
	opts Options

	mu     sync.Mutex
	pt     *Point // guarded by mu; nil until the first Get
	closed bool   // guarded by mu
}

// NewLazy returns a Lazy that makes its Point from opts on the first Get.
func NewLazy(opts Options) *Lazy { return &Lazy{opts: opts} }

// Get is the point, made now if it was not yet; ErrClosed after Close.
func (e *Lazy) Get() (*Point, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if e.pt == nil {
		pt, err := New(e.opts)
		if err != nil {
			return nil, err
		}
		e.pt = pt
	}
	return e.pt, nil
}

// Made is the point if Get made it, else nil.
func (e *Lazy) Made() *Point {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pt
}

// Close closes the point if it was made; later Gets fail.
func (e *Lazy) Close() {
	e.mu.Lock()
	pt := e.pt
	e.closed, e.pt = true, nil
	e.mu.Unlock()
	if pt != nil {
		_ = pt.Close()
	}
}
