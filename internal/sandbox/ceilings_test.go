package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
)

var testCeilings = Ceilings{MemoryMiB: 1024, CPU: 2, DiskGiB: 10, TTL: time.Hour, EnvBytes: 100, MetadataBytes: 100, FilesBytes: 100, Files: 3}

// bytesOf is a one-entry map whose key and value are n bytes together.
func bytesOf(n int) map[string]string { return map[string]string{"K": strings.Repeat("v", n-1)} }

// entries is a map of n one-byte files.
func entries(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("f%d", i)] = "x"
	}
	return m
}

// wantOver checks that err lists exactly the fields named, each with a
// message naming its ceiling (a field given "" is over no ceiling, only
// listed).
func wantOver(t *testing.T, err error, ceilings map[string]string) {
	t.Helper()
	var bad providers.InvalidFields
	if !errors.As(err, &bad) || providers.Kind(err) != providers.ErrInvalid {
		t.Fatalf("error %v (%T), want InvalidFields", err, err)
	}
	got := map[string]string{}
	for _, f := range bad {
		got[f.Field] += f.Message
	}
	for field, ceiling := range ceilings {
		if ceiling == "" && got[field] == "" {
			t.Errorf("%s: not listed", field)
		}
		if ceiling != "" && (!strings.Contains(got[field], "at most "+ceiling) || !strings.Contains(got[field], "the gateway's ceiling")) {
			t.Errorf("%s: %q, want it to name the ceiling %s", field, got[field], ceiling)
		}
		delete(got, field)
	}
	if len(got) > 0 {
		t.Errorf("other problems listed: %v", got)
	}
}

// TestCeilings: every ceiling below, at and above it. Below and at are
// created; above is refused naming the field and the ceiling, and nothing
// is created.
func TestCeilings(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Ceilings = testCeilings })
	i64 := func(v int64) *int64 { return &v }
	f64 := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		field, ceiling string
		req            func(step int) CreateRequest // step -1 below, 0 at, 1 above
	}{
		{"resources.memory_mib", "1024", func(s int) CreateRequest {
			return CreateRequest{Resources: providers.Resources{MemoryMiB: i64(1024 + int64(s))}}
		}},
		{"resources.cpu", "2", func(s int) CreateRequest {
			return CreateRequest{Resources: providers.Resources{CPU: f64(2 + float64(s)/100)}}
		}},
		{"resources.disk_gib", "10", func(s int) CreateRequest {
			return CreateRequest{Resources: providers.Resources{DiskGiB: f64(10 + float64(s)/2)}}
		}},
		{"ttl_s", "3600", func(s int) CreateRequest { return CreateRequest{TTL: dur(time.Hour + time.Duration(s)*time.Second)} }},
		{"env", "100 bytes", func(s int) CreateRequest { return CreateRequest{Env: bytesOf(100 + s)} }},
		{"metadata", "100 bytes", func(s int) CreateRequest { return CreateRequest{Metadata: bytesOf(100 + s)} }},
		{"files", "100 bytes", func(s int) CreateRequest {
			return CreateRequest{Files: map[string]string{"f": strings.Repeat("x", 99+s)}}
		}},
		{"files", "3 entries", func(s int) CreateRequest { return CreateRequest{Files: entries(3 + s)} }},
	} {
		t.Run(c.field+" "+c.ceiling, func(t *testing.T) {
			for _, s := range []int{-1, 0} {
				ref := e.create(t, c.req(s))
				if err := e.svc.Delete(context.Background(), lease(ref.Token), ref.SandboxID); err != nil {
					t.Fatal(err)
				}
			}
			_, err := e.svc.Create(context.Background(), Caller{}, c.req(1))
			wantOver(t, err, map[string]string{c.field: c.ceiling})
			if owned, _ := e.p.List(context.Background()); len(owned) != 0 {
				t.Errorf("%d sandboxes left after a refused create", len(owned))
			}
		})
	}

	t.Run("all at once", func(t *testing.T) {
		_, err := e.svc.Create(context.Background(), Caller{}, CreateRequest{
			TTL: dur(0), Env: bytesOf(101), Metadata: bytesOf(1 << 20), Workdir: "rel",
			Resources: providers.Resources{MemoryMiB: i64(1e8), CPU: f64(1000), DiskGiB: f64(5000)},
		})
		wantOver(t, err, map[string]string{"ttl_s": "3600", "env": "100", "metadata": "100", "resources.memory_mib": "1024",
			"resources.cpu": "2", "resources.disk_gib": "10", "workdir": ""})
		_, _, err = e.svc.CreateBatch(context.Background(), Caller{}, CreateRequest{Resources: providers.Resources{MemoryMiB: i64(2048)}}, 4, true)
		wantOver(t, err, map[string]string{"resources.memory_mib": "1024"})
		if owned, _ := e.p.List(context.Background()); len(owned) != 0 {
			t.Errorf("%d sandboxes left after refused creates", len(owned))
		}
	})

	t.Run("renew and mint", func(t *testing.T) {
		ctx := context.Background()
		ref := e.create(t, CreateRequest{})
		for _, ttl := range []time.Duration{time.Minute, time.Hour} {
			if _, err := e.svc.Renew(ctx, lease(ref.Token), ref.SandboxID, &ttl); err != nil {
				t.Errorf("renew %v under a ceiling of 1h: %v", ttl, err)
			}
			if _, err := e.svc.Mint(ctx, lease(ref.Token), ref.SandboxID, ScopeOperate, &ttl); err != nil {
				t.Errorf("mint %v under a ceiling of 1h: %v", ttl, err)
			}
		}
		before, _ := e.svc.Get(ctx, lease(ref.Token), ref.SandboxID)
		for _, ttl := range []time.Duration{time.Hour + time.Second, 0, 1 << 62} {
			_, err := e.svc.Renew(ctx, lease(ref.Token), ref.SandboxID, &ttl)
			wantOver(t, err, map[string]string{"ttl_s": "3600"})
		}
		if after, _ := e.svc.Get(ctx, lease(ref.Token), ref.SandboxID); after.TTL != before.TTL || !after.ExpiresAt.Equal(before.ExpiresAt) {
			t.Errorf("a refused renew changed the sandbox: %v %v -> %v %v", before.TTL, before.ExpiresAt, after.TTL, after.ExpiresAt)
		}
		_, err := e.svc.Mint(ctx, lease(ref.Token), ref.SandboxID, ScopeOperate, dur(time.Hour+time.Second))
		wantOver(t, err, map[string]string{"ttl_s": "3600"})
	})
}

// TestNoCeilings: zero ceilings are none: what the attacker asked
// for passes the service (the provider is left to refuse what it cannot).
func TestNoCeilings(t *testing.T) {
	e := newEnv(t, nil)
	mem, cpu, disk := int64(1e8), 1000.0, 5000.0
	e.create(t, CreateRequest{TTL: dur(0), Metadata: bytesOf(1 << 20), Files: entries(5000),
		Resources: providers.Resources{MemoryMiB: &mem, CPU: &cpu, DiskGiB: &disk}})
}

// TestCeilingsAtStart: a warm pool's spec or the default TTL over a
// ceiling fails New with a message naming the field and the ceiling; at
// the ceiling it starts.
func TestCeilingsAtStart(t *testing.T) {
	mem := func(v int64) providers.Resources { return providers.Resources{MemoryMiB: &v} }
	for _, c := range []struct {
		name    string
		opts    Options
		mention string // "" = starts
	}{
		{"pool over", Options{Pools: []PoolSpec{{Resources: mem(1025), Count: 1}}}, "resources.memory_mib: must be at most 1024 (the gateway's ceiling)"},
		{"pool at", Options{Pools: []PoolSpec{{Resources: mem(1024), Count: 1}}}, ""},
		{"default TTL over", Options{DefaultTTL: 2 * time.Hour}, "default TTL (7200 s) is over the TTL ceiling of 3600 s"},
		{"default TTL none", Options{DefaultTTL: -1}, "default TTL (no expiry) is over the TTL ceiling of 3600 s"},
		{"default TTL at", Options{DefaultTTL: time.Hour}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			opts := c.opts
			opts.StateDir, opts.Ceilings = t.TempDir(), testCeilings
			e := newEnvErr(t, opts)
			if c.mention == "" {
				if e != nil {
					t.Fatalf("New: %v", e)
				}
				return
			}
			if e == nil || !strings.Contains(e.Error(), c.mention) {
				t.Fatalf("New: %v, want an error saying %q", e, c.mention)
			}
		})
	}
}

// newEnvErr opens a service on a fake provider with opts and returns
// New's error; a service it opens is closed when t ends.
func newEnvErr(t *testing.T, opts Options) error {
	t.Helper()
	opts.Provider = fake.New()
	svc, err := New(context.Background(), opts)
	if err == nil {
		t.Cleanup(func() { svc.Close() })
	}
	return err
}
