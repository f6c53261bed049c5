package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

func TestParseShmSize(t *testing.T) {
	for _, c := range []struct {
		in   any
		want int64
	}{
		{float64(268435456), 268435456},
		{"268435456", 268435456},
		{"64m", 64 << 20},
		{"64M", 64 << 20},
		{"1g", 1 << 30},
		{"1gb", 1 << 30},
		{"512MiB", 512 << 20},
		{"1.5g", 3 << 29},
		{" 2k ", 2048},
		{"100b", 100},
	} {
		if got, err := parseShmSize(c.in); err != nil || got != c.want {
			t.Errorf("parseShmSize(%#v) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []any{"", "m", "-1m", "1x", "1 g b", "1e9", float64(1.5), true, []any{}} {
		if got, err := parseShmSize(bad); err == nil {
			t.Errorf("parseShmSize(%#v) = %d, want an error", bad, got)
		}
	}
}

// A bad shm_size is a 400 naming the field, and nothing is created.
func TestCreateShmSizeInvalid(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	var asked int64
	e.p.CreateCheck = func(spec providers.CreateSpec) error {
		asked = spec.ShmBytes
		return nil
	}
	mem := int64(128)
	for _, req := range []CreateRequest{
		{ShmSize: "lots"},
		{ShmSize: float64(0)},
		{ShmSize: float64(-5)},
		{ShmSize: "1k"},             // under 1 MiB
		{ShmSize: "65g"},            // over 64 GiB
		{ShmSize: "1e400"},          // not a size
		{ShmSize: float64(1 << 62)}, // far over
		{ShmSize: "256m", Resources: providers.Resources{MemoryMiB: &mem}},   // over the memory
		{ShmSize: "64m", ProviderOptions: map[string]any{"shm_size": "64m"}}, // twice
		{ProviderOptions: map[string]any{"shm_size": []any{1}}},
	} {
		_, err := e.svc.Create(ctx, Caller{}, req)
		wantKind(t, err, providers.ErrInvalid)
		var f providers.InvalidFields
		if !errors.As(err, &f) || len(f) != 1 || (f[0].Field != "shm_size" && f[0].Field != "provider_options.shm_size") {
			t.Errorf("%+v: fields %+v", req, f)
		}
	}
	if l, _ := e.svc.List(ctx, Caller{}, ListFilter{}); len(l) != 0 {
		t.Fatalf("bad creates made %d sandboxes", len(l))
	}
	for _, req := range []CreateRequest{
		{ShmSize: "64m"},
		{ShmSize: float64(128 << 20), Resources: providers.Resources{MemoryMiB: &mem}},
		{ProviderOptions: map[string]any{"shm_size": "1g"}},
	} {
		if _, err := e.svc.Create(ctx, Caller{}, req); err != nil {
			t.Errorf("%+v: %v", req, err)
		}
	}
	if asked != 1<<30 {
		t.Fatalf("the provider was asked for %d bytes of /dev/shm", asked)
	}
}
