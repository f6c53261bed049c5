package sandbox

import (
	"context"
	"fmt"
	"math"

	"github.com/sandgate/sandgate/internal/providers"
)

// Quotas are what each API key may hold (the anonymous caller of a
// gateway without keys is one key). Zero fields are unlimited.
type Quotas struct {
	Sandboxes     int   // live sandboxes, with the key's queued creates
	MemoryMiB     int64 // memory committed by them (see Options.DefaultMemoryMiB)
	DiskMiB       int64 // disk committed by them (see Options.DefaultDiskGiB)
	Snapshots     int   // snapshots kept (a fork's internal ones not counted)
	SnapshotBytes int64 // bytes of those snapshots, as the provider reports them
}

// Budget is the gateway-wide admission budget: memory and disk committed
// by all live sandboxes together. Zero fields are unlimited.
type Budget struct {
	MemoryMiB int64
	DiskMiB   int64
}

// QuotaError is a request refused because it would take its key over a
// quota: ErrTooMany (429), with the problem code quota_exceeded.
type QuotaError struct {
	Quota string // which: sandboxes, memory_mib, disk_gib, snapshots, snapshot_bytes
	err   error  // the ErrTooMany with the client's message
}

func newQuotaError(quota, msg string) *QuotaError {
	return &QuotaError{Quota: quota, err: providers.Errorf(providers.ErrTooMany, "%s", msg)}
}

func (e *QuotaError) Error() string   { return e.err.Error() }
func (e *QuotaError) Unwrap() error   { return e.err }
func (e *QuotaError) APICode() string { return "quota_exceeded" }

// demandOf is what a create of req commits: its resources, or the
// defaults the provider applies when it sets none.
func (s *Service) demandOf(creator string, r providers.Resources) demand {
	d := demand{key: creator}
	if r.MemoryMiB != nil && *r.MemoryMiB > 0 {
		d.memMiB = *r.MemoryMiB
	} else {
		d.memMiB = max(s.opts.DefaultMemoryMiB, 0)
	}
	gib := s.opts.DefaultDiskGiB
	if r.DiskGiB != nil && *r.DiskGiB > 0 {
		gib = *r.DiskGiB
	}
	if gib > 0 {
		d.diskMiB = int64(math.Ceil(gib * 1024))
	}
	return d
}

// QuotaInfo is one key's limits and usage, and the gateway's admission
// numbers. Limits of 0 are unlimited.
type QuotaInfo struct {
	Limits Quotas

	Sandboxes int   // live, holding a slot
	Queued    int   // creates waiting in the queue
	MemoryMiB int64 // committed by the key's live sandboxes
	DiskMiB   int64

	// Snapshots counts the key's snapshots but not the hidden ones: a
	// fork's, and one its owner deleted while sandboxes made from it live.
	// Those leave the quota at once: the owner can neither see nor remove
	// them, and they last only as long as sandboxes the key already
	// holds (and pays for in Sandboxes).
	Snapshots     int
	SnapshotBytes int64 // their bytes (0 for a provider that cannot tell)
	// Volumes and VolumeBytes are the key's volumes: their size counts
	// against the disk quota with the sandboxes' DiskMiB.
	Volumes     int
	VolumeBytes int64

	// OrphanedSnapshots are those of Snapshots whose source sandbox is gone:
	// deleting them (DELETE /v1/snapshots/{sid}) frees their quota.
	OrphanedSnapshots     int
	OrphanedSnapshotBytes int64

	Gateway GatewayAdmission
}

// GatewayAdmission is the gateway-wide admission state.
type GatewayAdmission struct {
	MaxSandboxes    int
	Sandboxes       int
	Queued          int
	MemoryMiB       int64 // committed
	DiskMiB         int64
	MemoryBudgetMiB int64 // 0: none
	DiskBudgetMiB   int64
}

// Quota returns the limits and usage of the caller's API key.
func (s *Service) Quota(ctx context.Context, c Caller) (QuotaInfo, error) {
	creator, err := s.authorizeKey(c)
	if err != nil {
		return QuotaInfo{}, err
	}
	u := s.slots.usage(creator)
	q := QuotaInfo{
		Limits:    s.opts.Quotas,
		Sandboxes: u.live, Queued: u.queued, MemoryMiB: u.mem, DiskMiB: u.disk,
		Gateway: GatewayAdmission{
			MaxSandboxes: s.opts.MaxSandboxes, Sandboxes: u.used, Queued: u.allQueued,
			MemoryMiB: u.allMem, DiskMiB: u.allDisk,
			MemoryBudgetMiB: s.opts.Budget.MemoryMiB, DiskBudgetMiB: s.opts.Budget.DiskMiB,
		},
	}
	su := s.snapshotUsage(creator)
	q.Snapshots, q.SnapshotBytes = su.count, su.bytes
	q.OrphanedSnapshots, q.OrphanedSnapshotBytes = su.orphans, su.orphanBytes
	q.Volumes, q.VolumeBytes = s.volumeUsage(creator)
	return q, nil
}

type snapUsage struct {
	count, orphans     int
	bytes, orphanBytes int64
}

// snapshotUsage counts key's snapshots (not the hidden ones) and those
// whose source sandbox is no longer live.
func (s *Service) snapshotUsage(key string) snapUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	var u snapUsage
	for _, sn := range s.snaps {
		if sn.Creator != key || hidden(sn) {
			continue
		}
		u.count++
		u.bytes += sn.SizeBytes
		if b := s.boxes[sn.SandboxID]; b == nil || !b.rec.State.Live() {
			u.orphans++
			u.orphanBytes += sn.SizeBytes
		}
	}
	return u
}

// checkSnapshotQuota refuses a new snapshot for key when it already holds
// its quota of snapshots or of snapshot bytes.
func (s *Service) checkSnapshotQuota(key string) error {
	q := s.opts.Quotas
	if q.Snapshots <= 0 && q.SnapshotBytes <= 0 {
		return nil
	}
	u := s.snapshotUsage(key)
	switch {
	case q.Snapshots > 0 && u.count >= q.Snapshots:
		return s.snapshotOverQuota("snapshots", fmt.Sprintf("%d snapshots (it holds %d, %d of them of deleted sandboxes)", q.Snapshots, u.count, u.orphans))
	case q.SnapshotBytes > 0 && u.bytes >= q.SnapshotBytes:
		return s.snapshotOverQuota("snapshot_bytes", fmt.Sprintf("%d bytes of snapshots (it holds %d, %d of them of deleted sandboxes)", q.SnapshotBytes, u.bytes, u.orphanBytes))
	}
	return nil
}

// checkSnapshotQuotaAfter refuses the snapshot just kept for key when it
// took the key over its quota of snapshots or of snapshot bytes.
func (s *Service) checkSnapshotQuotaAfter(key string, size int64) error {
	q := s.opts.Quotas
	if q.Snapshots <= 0 && q.SnapshotBytes <= 0 {
		return nil
	}
	u := s.snapshotUsage(key)
	switch {
	case q.Snapshots > 0 && u.count > q.Snapshots:
		return s.snapshotOverQuota("snapshots", fmt.Sprintf("%d snapshots (concurrent snapshots took it over)", q.Snapshots))
	case q.SnapshotBytes > 0 && u.bytes > q.SnapshotBytes:
		return s.snapshotOverQuota("snapshot_bytes", fmt.Sprintf("%d bytes of snapshots (this one of %d bytes would make it %d)", q.SnapshotBytes, size, u.bytes))
	}
	return nil
}

func (s *Service) snapshotOverQuota(which, what string) error {
	s.m.QuotaRefusals.WithLabelValues(which).Inc()
	return newQuotaError(which, "quota exceeded: this API key may keep "+what+"; delete some (DELETE /v1/snapshots/{sid}) first")
}
