package docker

import (
	"context"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/image"

	"github.com/sandgate/sandgate/internal/providers"
)

// A snapshot is the sandbox's container committed to a local image,
// sandgate-snapshot:<snapshot id>, labelled with the snapshot and the
// instance (so an instance's clean-up finds them). The agent's volume is
// not in it (volumes never are). A sandbox made from a snapshot is a
// container of that image; the image cannot be removed while one exists.

// LabelSnapshot marks the snapshot images.
const LabelSnapshot = "sandgate.snapshot"

var _ providers.Snapshotter = (*Docker)(nil)

func snapshotRef(sid string) string { return "sandgate-snapshot:" + sid }

// Snapshot commits sandbox id's container (paused for the commit) as
// snapshot sid and returns what the commit added to the container's image.
func (d *Docker) Snapshot(ctx context.Context, id, sid string) (int64, error) {
	info, err := d.cli.ContainerInspect(ctx, id)
	if err != nil {
		return 0, d.kind(err, "sandbox %s", id)
	}
	if info.Config == nil || info.Config.Labels[LabelSandbox] != id {
		return 0, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	if info.State == nil || !info.State.Running {
		return 0, providers.Errorf(providers.ErrConflict, "sandbox %s is not running", id)
	}
	res, err := d.cli.ContainerCommit(ctx, id, container.CommitOptions{
		Reference: snapshotRef(sid),
		Pause:     true,
		Comment:   "sandgate snapshot of " + id,
		Config:    &container.Config{Labels: map[string]string{LabelSnapshot: sid, LabelInstance: d.instance}},
	})
	if err != nil {
		return 0, d.kind(err, "snapshot sandbox %s", id)
	}
	snap, err := d.cli.ImageInspect(ctx, res.ID)
	if err != nil {
		return 0, d.kind(err, "snapshot sandbox %s", id)
	}
	base, err := d.cli.ImageInspect(ctx, info.Image)
	if err != nil {
		return snap.Size, nil
	}
	return max(snap.Size-base.Size, 0), nil
}

// DeleteSnapshot removes snapshot sid's image: ErrConflict while a
// sandbox made from it exists.
func (d *Docker) DeleteSnapshot(ctx context.Context, sid string) error {
	_, err := d.cli.ImageRemove(ctx, snapshotRef(sid), image.RemoveOptions{PruneChildren: true})
	switch {
	case err == nil:
		return nil
	case cerrdefs.IsNotFound(err):
		return providers.Wrap(providers.ErrNotFound, err, "snapshot "+sid+" not found")
	case cerrdefs.IsConflict(err):
		return providers.Wrap(providers.ErrConflict, err, "snapshot "+sid+" is in use by a sandbox")
	}
	return d.kind(err, "delete snapshot %s", sid)
}
