package testkit

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// NewID returns a fresh sandbox id that starts with IDPrefix.
func NewID() string {
	return IDPrefix + randomBase32(12)
}

// IDPrefix starts every id NewID makes in this process, so a test binary
// can tell its own sandboxes from those of other binaries running at the
// same time (go test runs packages in parallel).
var IDPrefix = "sbx-" + randomBase32(8)

func randomBase32(n int) string {
	b := make([]byte, 10)
	rand.Read(b)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))[:n]
}

// Create makes a sandbox on p from spec and deletes it when t ends (a
// sandbox already gone is no error). An empty ID is filled with NewID, a
// zero ReadyTimeout with a minute; the create itself may take timeout.
func Create(t testing.TB, p providers.Provider, spec providers.CreateSpec, timeout time.Duration) providers.Sandbox {
	t.Helper()
	if spec.ID == "" {
		spec.ID = NewID()
	}
	if spec.ReadyTimeout == 0 {
		spec.ReadyTimeout = time.Minute
	}
	sb, err := p.Create(Context(t, timeout), spec)
	if err != nil {
		t.Fatalf("Create %s: %v", spec.ID, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if err := p.Delete(ctx, spec.ID); err != nil && !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Delete %s at clean-up: %v", spec.ID, err)
		}
	})
	return sb
}
