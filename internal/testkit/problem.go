package testkit

import (
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// WantFields checks the field errors of a 400 problem: errs names each
// field of want with messages that contain its text, and no other field.
// A mismatch is an error of t, not a fatal one, so every field is
// reported.
func WantFields(t testing.TB, errs []providers.FieldError, want map[string]string) {
	t.Helper()
	got := map[string]string{}
	for _, f := range errs {
		got[f.Field] += f.Message
	}
	for field, text := range want {
		if !strings.Contains(got[field], text) {
			t.Errorf("%s: %q, want it to say %q", field, got[field], text)
		}
		delete(got, field)
	}
	if len(got) > 0 {
		t.Errorf("other problems listed: %v", got)
	}
}
