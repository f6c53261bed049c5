package docker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/volume"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// Volumes. A volume's storage is the local provider's (jail.MakeVolume: a
// sparse image of its size, loop-mounted under Options.VolumeDir), so its
// size limit is real on any storage driver; the docker volume named
// volumeName(id) is the local driver's bind of that mount. The daemon
// must therefore run on the gateway's host. A container's root is host
// root, which is uid 0 on the volume: what a local sandbox's root wrote.
// A mount of a sub_path (or of a host_path) is a bind of a staged mount
// of the directory, resolved by descriptor beneath its source, because
// the daemon (API 1.41) has no volume sub-paths and resolves a bind's
// source path itself, following symlinks a sandbox may have planted.

var _ providers.Volumer = (*Docker)(nil)

// volumeIDPattern: the ids the service makes (vol-…), and nothing that
// could leave VolumeDir.
var volumeIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func validID(id string) bool { return volumeIDPattern.MatchString(id) }

// volumeName is the docker volume of sandgate volume id.
func volumeName(id string) string { return "sandgate-" + id }

// stagingDir holds the staged mounts of creates in flight.
const stagingDir = "staging"

func (d *Docker) volumeDir(id string) string { return filepath.Join(d.opts.VolumeDir, id) }

// CreateVolume makes volume id's storage of sizeBytes (whole MiB, at
// least jail.MinDiskBytes) and its docker volume.
func (d *Docker) CreateVolume(ctx context.Context, id string, sizeBytes int64) error {
	if d.opts.VolumeDir == "" {
		return providers.Errorf(providers.ErrUnsupported, "this docker provider has no volume directory")
	}
	if !validID(id) {
		return providers.Errorf(providers.ErrInvalid, "volume id must be 1-63 lowercase letters, digits or dashes")
	}
	if sizeBytes < jail.MinDiskBytes {
		return providers.Errorf(providers.ErrInvalid, "a volume is at least %d MiB", jail.MinDiskBytes>>20)
	}
	fs, mkfs, err := jail.FindMkfs("")
	if err != nil {
		return providers.Wrap(providers.ErrUnsupported, err, "this host cannot make volumes")
	}
	dir := d.volumeDir(id)
	if err := jail.MakeVolume(fs, mkfs, filepath.Join(d.opts.VolumeDir, "templates"), dir, sizeBytes>>20<<20); err != nil {
		if errors.Is(err, os.ErrExist) {
			return providers.Errorf(providers.ErrConflict, "volume %s exists", id)
		}
		return fmt.Errorf("make volume %s: %w", id, err)
	}
	_, err = d.cli.VolumeCreate(ctx, volume.CreateOptions{
		Name:       volumeName(id),
		Driver:     "local",
		DriverOpts: map[string]string{"type": "none", "o": "bind", "device": filepath.Join(dir, jail.VolumeMnt)},
		Labels:     map[string]string{LabelInstance: d.instance},
	})
	if err != nil {
		if rerr := jail.RemoveVolume(dir); rerr != nil {
			d.log.Error("docker: remove a half-made volume", "volume", id, "err", rerr)
		}
		return d.kind(err, "create volume %s", id)
	}
	return nil
}

// DeleteVolume removes volume id's docker volume and its storage.
func (d *Docker) DeleteVolume(ctx context.Context, id string) error {
	if d.opts.VolumeDir == "" || !validID(id) {
		return providers.Errorf(providers.ErrNotFound, "volume %s not found", id)
	}
	dir := d.volumeDir(id)
	_, statErr := os.Stat(dir)
	err := d.cli.VolumeRemove(ctx, volumeName(id), false)
	switch {
	case err != nil && cerrdefs.IsNotFound(err) && statErr != nil:
		return providers.Errorf(providers.ErrNotFound, "volume %s not found", id)
	case err != nil && !cerrdefs.IsNotFound(err):
		return d.kind(err, "delete volume %s", id)
	}
	if err := jail.RemoveVolume(dir); err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// remountVolumes mounts the volumes whose mounts the host lost (see
// jail.RemountVolumes), and removes the staged mounts of creates a
// gateway that died left behind.
func (d *Docker) remountVolumes() {
	if d.opts.VolumeDir == "" {
		return
	}
	staging := filepath.Join(d.opts.VolumeDir, stagingDir)
	if ents, err := os.ReadDir(staging); err == nil {
		var left []string
		for _, e := range ents {
			left = append(left, filepath.Join(staging, e.Name()))
		}
		d.unstage(left)
	}
	jail.RemountVolumes(d.opts.VolumeDir, func(name string, err error) {
		d.log.Error("docker: mount volume", "volume", name, "err", err)
	})
}

// volumeMounts returns the container mounts of spec's volumes, and the
// staged mounts to remove (unstage) once the container started (its own
// mounts are copies) or failed to.
func (d *Docker) volumeMounts(spec providers.CreateSpec) ([]mount.Mount, []string, error) {
	if len(spec.Volumes) > 0 && d.opts.VolumeDir == "" {
		return nil, nil, providers.Errorf(providers.ErrUnsupported, "this docker provider has no volumes")
	}
	var out []mount.Mount
	var staged []string
	var problems []string
	for i, v := range spec.Volumes {
		src := v.HostPath
		if v.Volume != "" {
			src = filepath.Join(d.volumeDir(v.Volume), jail.VolumeMnt)
			if !validID(v.Volume) {
				problems = append(problems, fmt.Sprintf("volumes[%d]: volume %s not found", i, v.Volume))
				continue
			}
			if _, err := os.Stat(src); err != nil {
				problems = append(problems, fmt.Sprintf("volumes[%d]: volume %s not found", i, v.Volume))
				continue
			}
			if !jail.VolumeMounted(d.volumeDir(v.Volume)) {
				d.unstage(staged)
				return nil, nil, providers.Errorf(providers.ErrUnavailable, "volume %s is not mounted (see the gateway's log)", v.Volume)
			}
		}
		if v.Volume != "" && v.SubPath == "" {
			out = append(out, mount.Mount{Type: mount.TypeVolume, Source: volumeName(v.Volume), Target: v.MountPath, ReadOnly: v.ReadOnly})
			continue
		}
		dst := filepath.Join(d.opts.VolumeDir, stagingDir, spec.ID+"-"+strconv.Itoa(i))
		if err := jail.StageBind(src, v.SubPath, dst); err != nil {
			problems = append(problems, fmt.Sprintf("volumes[%d].sub_path %q %s", i, v.SubPath, jail.SubPathProblem(err)))
			continue
		}
		staged = append(staged, dst)
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: dst, Target: v.MountPath, ReadOnly: v.ReadOnly,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate}})
	}
	if len(problems) > 0 {
		d.unstage(staged)
		return nil, nil, providers.Errorf(providers.ErrInvalid, "%s", strings.Join(problems, "; "))
	}
	return out, staged, nil
}

func (d *Docker) unstage(staged []string) {
	for _, p := range staged {
		if err := jail.Unstage(p); err != nil {
			d.log.Error("docker: remove a staged mount", "path", p, "err", err)
		}
	}
}
