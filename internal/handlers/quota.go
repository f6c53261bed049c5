package handlers

import (
	"context"

	"github.com/sandgate/sandgate/internal/api"
)

// mibToGiB renders MiB as the API's GiB.
func mibToGiB(mib int64) float64 { return float64(mib) / 1024 }

func (s *server) GetQuota(ctx context.Context, req api.GetQuotaRequestObject) (api.GetQuotaResponseObject, error) {
	q, err := s.svc.Quota(ctx, callerFrom(ctx))
	if err != nil {
		return nil, err
	}
	l, g := q.Limits, q.Gateway
	return api.GetQuota200JSONResponse{
		Limits: api.QuotaLimits{
			Sandboxes: l.Sandboxes, MemoryMib: l.MemoryMiB, DiskGib: mibToGiB(l.DiskMiB),
			Snapshots: l.Snapshots, SnapshotBytes: l.SnapshotBytes,
		},
		Usage: api.QuotaUsage{
			Sandboxes: q.Sandboxes, Queued: q.Queued, MemoryMib: q.MemoryMiB, DiskGib: mibToGiB(q.DiskMiB),
			Snapshots: q.Snapshots, SnapshotBytes: q.SnapshotBytes,
			OrphanedSnapshots: q.OrphanedSnapshots, OrphanedSnapshotBytes: q.OrphanedSnapshotBytes,
			Volumes: q.Volumes, VolumeGib: float64(q.VolumeBytes) / (1 << 30),
		},
		Gateway: api.GatewayAdmission{
			MaxSandboxes: g.MaxSandboxes, Sandboxes: g.Sandboxes, Queued: g.Queued,
			MemoryMib: g.MemoryMiB, DiskGib: mibToGiB(g.DiskMiB),
			MemoryBudgetMib: g.MemoryBudgetMiB, DiskBudgetGib: mibToGiB(g.DiskBudgetMiB),
		},
	}, nil
}
