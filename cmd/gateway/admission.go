package main

import (
	"fmt"
	"math"

	"github.com/sandgate/sandgate/internal/host"
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
	memMiB, err := host.MemoryMiB()
	if err != nil {
		return o, fmt.Errorf("host memory for the admission budget: %w", err)
	}
	diskGiB, err := host.DiskGiB(cfg.StateDir)
	if err != nil {
		return o, fmt.Errorf("state dir filesystem size for the admission budget: %w", err)
	}
	diskMiB := diskGiB * 1024
	o.Budget = sandbox.Budget{MemoryMiB: int64(float64(memMiB) * cfg.Overcommit), DiskMiB: int64(diskMiB * cfg.DiskOvercommit)}
	return o, nil
}
