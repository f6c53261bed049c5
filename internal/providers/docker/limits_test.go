package docker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/system"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// TestDefaultLimits: a create without resources gets the provider's
// defaults; Options change them; <0 turns one off; a request's resources
// override them.
func TestDefaultLimits(t *testing.T) {
	t.Parallel()
	ncpu := func(p *Docker) int64 {
		f, err := p.daemonFacts(ctxFor(t, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		return int64(f.ncpu)
	}
	for _, c := range []struct {
		name      string
		opts      func(*Options)
		res       providers.Resources
		mem, pids int64
		cpu       func(ncpu int64) int64 // NanoCPUs
	}{
		{"defaults", nil, providers.Resources{}, DefaultMemoryLimitMiB << 20, DefaultPidsLimit,
			func(n int64) int64 { return min(2, n) * 1e9 }},
		{"options", func(o *Options) { o.DefaultMemoryMiB, o.DefaultCPU, o.PidsLimit = 100, 0.25, 50 }, providers.Resources{}, 100 << 20, 50,
			func(int64) int64 { return 2.5e8 }},
		{"off", func(o *Options) { o.DefaultMemoryMiB, o.DefaultCPU, o.PidsLimit = -1, -1, -1 }, providers.Resources{}, 0, 0,
			func(int64) int64 { return 0 }},
		{"request", nil, providers.Resources{MemoryMiB: ptr(int64(300)), CPU: ptr(0.5)}, 300 << 20, DefaultPidsLimit,
			func(int64) int64 { return 5e8 }},
		// More CPUs than the daemon has is as much as it has (the daemon
		// refuses more).
		{"too many cpus", nil, providers.Resources{CPU: ptr(1000.0)}, DefaultMemoryLimitMiB << 20, DefaultPidsLimit,
			func(n int64) int64 { return n * 1e9 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var mods []func(*Options)
			if c.opts != nil {
				mods = append(mods, c.opts)
			}
			p := newProvider(t, mods...)
			id := create(t, p, providers.CreateSpec{Resources: c.res})
			info, err := p.cli.ContainerInspect(ctxFor(t, time.Minute), id)
			if err != nil {
				t.Fatal(err)
			}
			hc := info.HostConfig
			var pids int64
			if hc.PidsLimit != nil {
				pids = *hc.PidsLimit
			}
			if hc.Memory != c.mem || hc.MemorySwap != c.mem || hc.NanoCPUs != c.cpu(ncpu(p)) || pids != c.pids {
				t.Errorf("memory %d swap %d cpus %d pids %d; want memory = swap = %d, cpus %d, pids %d",
					hc.Memory, hc.MemorySwap, hc.NanoCPUs, pids, c.mem, c.cpu(ncpu(p)), c.pids)
			}
		})
	}
}

func TestDefaultLimitsInvalid(t *testing.T) {
	if _, err := New(Options{DefaultMemoryMiB: 5}); err == nil {
		t.Error("New accepted a default memory limit of 5 MiB")
	}
	p := newProvider(t)
	for _, cpu := range []float64{0, 0.001, -1, 2000} {
		_, err := p.Create(ctxFor(t, time.Minute), providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, Resources: providers.Resources{CPU: &cpu}})
		if !errors.Is(err, providers.ErrInvalid) || !contains([]byte(providers.Message(err)), "resources.cpu") {
			t.Errorf("cpu %v: %v, want ErrInvalid naming resources.cpu", cpu, err)
		}
	}
}

// TestDiskLimit: disk_gib is enforced where the daemon's storage driver
// can (StorageOpt size) and otherwise accepted and reported as not
// enforced in Extra; a create without it says nothing about disk.
func TestDiskLimit(t *testing.T) {
	p := newProvider(t)
	ctx := ctxFor(t, time.Minute)
	f, err := p.daemonFacts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spec := providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, Resources: providers.Resources{DiskGiB: ptr(5.0)}, ReadyTimeout: time.Minute}
	sb, err := p.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Delete(context.Background(), spec.ID) })
	info, err := p.cli.ContainerInspect(ctx, spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	got := sb.Extra["disk_limit"]
	// A daemon that looked able may still refuse (xfs without pquota);
	// then the provider says so and remembers.
	f2, _ := p.daemonFacts(ctx)
	switch {
	case f2.diskQuota && (got != diskEnforced || info.HostConfig.StorageOpt["size"] != "5120M"):
		t.Errorf("able daemon: extra %v, StorageOpt %v", sb.Extra, info.HostConfig.StorageOpt)
	case !f2.diskQuota && (got != diskNotEnforced || len(info.HostConfig.StorageOpt) != 0):
		t.Errorf("daemon that cannot limit disk: extra %v, StorageOpt %v", sb.Extra, info.HostConfig.StorageOpt)
	}
	t.Logf("daemon disk quota: %v; disk_limit %q", f.diskQuota, got)

	sb, err = p.Create(ctx, providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, ReadyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Delete(context.Background(), sb.ID) })
	if _, ok := sb.Extra["disk_limit"]; ok || sb.Extra["container_id"] == nil {
		t.Errorf("create without disk_gib: extra %v", sb.Extra)
	}
}

func TestDiskQuotaDetection(t *testing.T) {
	status := func(fs string) [][2]string {
		return [][2]string{{"Backing Filesystem", fs}, {"Supports d_type", "true"}, {"Native Overlay Diff", "true"}}
	}
	for _, c := range []struct {
		info system.Info
		want bool
	}{
		{system.Info{Driver: "overlay2", DriverStatus: status("extfs")}, false},
		{system.Info{Driver: "overlay2", DriverStatus: status("xfs")}, true},
		{system.Info{Driver: "overlay2", DriverStatus: [][2]string{{"Backing Filesystem", "xfs"}, {"Supports d_type", "false"}}}, false},
		{system.Info{Driver: "btrfs"}, true},
		{system.Info{Driver: "zfs"}, true},
		{system.Info{Driver: "vfs"}, false},
		{system.Info{Driver: "fuse-overlayfs", DriverStatus: status("xfs")}, false},
	} {
		if got := diskQuota(c.info); got != c.want {
			t.Errorf("%s %v: %v, want %v", c.info.Driver, c.info.DriverStatus, got, c.want)
		}
	}
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{"Error response from daemon: --storage-opt is supported only for overlay over xfs with 'pquota' mount option", true},
		{"Error response from daemon: Failed to enable quota for btrfs", true},
		{"Error response from daemon: Conflict. The container name is already in use", false},
	} {
		if got := storageOptRefused(errors.New(c.msg)); got != c.want {
			t.Errorf("%q: %v, want %v", c.msg, got, c.want)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestPidsLimitCeiling: a create's pids_limit above the operator's
// ceiling (the 4194304 among them) is ErrInvalid naming the option
// and the ceiling, and makes no container; one at the ceiling gets it; the
// default is lowered to the ceiling, and a default above it fails New.
func TestPidsLimitCeiling(t *testing.T) {
	const ceiling = 100
	p := newProvider(t, func(o *Options) { o.MaxPidsLimit = ceiling })
	if p.opts.PidsLimit != ceiling {
		t.Errorf("default pids limit %d under a ceiling of %d, want the ceiling", p.opts.PidsLimit, ceiling)
	}
	before, err := p.List(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{ceiling + 1, 1 << 22} {
		_, err := p.Create(ctxFor(t, time.Minute), providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, Workdir: "/workspace",
			ReadyTimeout: time.Minute, Options: map[string]any{"pids_limit": n}})
		var bad providers.InvalidFields
		if !errors.As(err, &bad) || len(bad) != 1 || bad[0].Field != "provider_options.pids_limit" || bad[0].Message != "must be at most 100 (the gateway's ceiling)" {
			t.Errorf("pids_limit %d over a ceiling of %d: %v", n, ceiling, err)
		}
	}
	if after, err := p.List(ctxFor(t, time.Minute)); err != nil || len(after) != len(before) {
		t.Errorf("refused creates left containers: %d before, %d after (%v)", len(before), len(after), err)
	}
	id := create(t, p, providers.CreateSpec{Options: map[string]any{"pids_limit": ceiling}})
	info, err := p.cli.ContainerInspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	if l := info.HostConfig.PidsLimit; l == nil || *l != ceiling {
		t.Errorf("pids_limit at the ceiling: container limit %v, want %d", l, ceiling)
	}
	for _, def := range []int64{ceiling + 1, -1} {
		if _, err := New(Options{PidsLimit: def, MaxPidsLimit: ceiling}); err == nil || !strings.Contains(err.Error(), "ceiling") {
			t.Errorf("default pids limit %d over a ceiling of %d: New gave %v", def, ceiling, err)
		}
	}
}
