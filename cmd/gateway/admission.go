package main

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/sandbox"
)

// admissionOptions are the service's admission budget, per-key quotas and
// the defaults a create commits when it sets no memory_mib or disk_gib.
// The budget is measured on this host (local; docker, whose daemon is
// taken to be here); a cluster's nodes are not, so kubernetes has none.
func admissionOptions(cfg config) (sandbox.Options, error) {
	o := sandbox.Options{
		Quotas: sandbox.Quotas{
			Sandboxes:     cfg.QuotaSandboxes,
			MemoryMiB:     cfg.QuotaMemoryMiB,
			DiskMiB:       int64(math.Ceil(cfg.QuotaDiskGiB * 1024)),
			Snapshots:     cfg.QuotaSnapshots,
			SnapshotBytes: int64(cfg.QuotaSnapshotBytes),
		},
		DefaultMemoryMiB: max(cfg.DefaultMemoryMiB, 0),
	}
	if cfg.Provider == "local" {
		// Only local applies a default disk limit.
		o.DefaultDiskGiB = max(cfg.DefaultDiskGiB, 0)
	}
	if cfg.Provider != "local" && cfg.Provider != "docker" {
		return o, nil
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return o, fmt.Errorf("host memory for the admission budget: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(cfg.StateDir, &fs); err != nil {
		return o, fmt.Errorf("state dir filesystem size for the admission budget: %w", err)
	}
	memMiB := float64(si.Totalram) * float64(si.Unit) / (1 << 20)
	diskMiB := float64(fs.Blocks) * float64(fs.Bsize) / (1 << 20)
	o.Budget = sandbox.Budget{MemoryMiB: int64(memMiB * cfg.Overcommit), DiskMiB: int64(diskMiB * cfg.DiskOvercommit)}
	return o, nil
}
