package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
)

// sweeper is a fake provider that sweeps: it records, at each sweep,
// whether it still held the orphan.
type sweeper struct {
	*fake.Provider
	orphan string
	err    error
	sweeps []bool // orphan held, per sweep
}

var _ providers.Sweeper = (*sweeper)(nil)

func (s *sweeper) Sweep(context.Context) error {
	s.sweeps = append(s.sweeps, s.Has(s.orphan))
	return s.err
}

// The service sweeps the provider's leftovers once at start, after it
// deleted the orphan sandboxes; a failed sweep does not stop the start.
func TestSweepAtStart(t *testing.T) {
	for _, fail := range []error{nil, errors.New("the API server refused")} {
		p := &sweeper{Provider: fake.New(), orphan: "sbx-orphanorphanorphanor", err: fail}
		p.Adopt(p.orphan)
		svc, err := New(context.Background(), Options{Provider: p, StateDir: t.TempDir(), AllowAnonymous: true, ReapInterval: time.Hour})
		if err != nil {
			t.Fatalf("start with a sweep failing with %v: %v", fail, err)
		}
		svc.Close()
		if len(p.sweeps) != 1 || p.sweeps[0] {
			t.Errorf("sweep failing with %v: sweeps %v, want one, after the orphan was deleted", fail, p.sweeps)
		}
	}
}
