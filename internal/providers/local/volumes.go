package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

var _ providers.Volumer = (*Local)(nil)

// volumesDir holds one directory per volume (see jail.MakeVolume), named
// by its id.
const volumesDir = "volumes"

func (l *Local) volumeDir(id string) string { return filepath.Join(l.stateDir, volumesDir, id) }

// volumeSource returns the host directory holding volume id's files, as
// mounted by the gateway; ErrUnavailable when it is not mounted.
func (l *Local) volumeSource(id string) (string, error) {
	if !idPattern.MatchString(id) {
		return "", providers.Errorf(providers.ErrNotFound, "volume %s not found", id)
	}
	dir := l.volumeDir(id)
	if _, err := os.Stat(dir); err != nil {
		return "", providers.Errorf(providers.ErrNotFound, "volume %s not found", id)
	}
	if !jail.VolumeMounted(dir) {
		return "", providers.Errorf(providers.ErrUnavailable, "volume %s is not mounted (see the gateway's log)", id)
	}
	return filepath.Join(dir, jail.VolumeMnt), nil
}

// CreateVolume makes volume id: a filesystem of its own of sizeBytes
// (whole MiB, at least jail.MinDiskBytes), mounted under the state
// directory.
func (l *Local) CreateVolume(ctx context.Context, id string, sizeBytes int64) error {
	if l.isolation != IsolationNamespaces || l.mkfs == "" {
		return providers.Errorf(providers.ErrUnsupported, "this local provider cannot make volumes (it needs isolation namespaces, loop devices and mkfs)")
	}
	if !idPattern.MatchString(id) {
		return providers.Errorf(providers.ErrInvalid, "volume id must be 1-63 lowercase letters, digits or dashes")
	}
	if sizeBytes < jail.MinDiskBytes {
		return providers.Errorf(providers.ErrInvalid, "a volume is at least %d MiB", jail.MinDiskBytes>>20)
	}
	sizeBytes = sizeBytes >> 20 << 20
	dir := l.volumeDir(id)
	if err := jail.MakeVolume(l.diskFS, l.mkfs, l.stateDir+"/disk-templates", dir, sizeBytes); err != nil {
		if errors.Is(err, os.ErrExist) {
			return providers.Errorf(providers.ErrConflict, "volume %s exists", id)
		}
		return fmt.Errorf("make volume %s: %w", id, err)
	}
	return nil
}

// DeleteVolume unmounts volume id and removes its image.
func (l *Local) DeleteVolume(ctx context.Context, id string) error {
	if _, err := os.Stat(l.volumeDir(id)); err != nil || !idPattern.MatchString(id) {
		return providers.Errorf(providers.ErrNotFound, "volume %s not found", id)
	}
	if err := jail.RemoveVolume(l.volumeDir(id)); err != nil {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}

// mountVolumes mounts the volumes on disk that are not mounted (see
// jail.RemountVolumes).
func (l *Local) mountVolumes() {
	jail.RemountVolumes(filepath.Join(l.stateDir, volumesDir), func(id string, err error) {
		l.log.Error("local: mount volume", "volume", id, "err", err)
	})
}

// volumeBinds turns a create's volume mounts into init's, checking each
// sub_path resolves to a directory inside its source (the authoritative
// resolution is setup's, by descriptor, at mount time; this one gives the
// client a 400 instead of a failed start).
func (l *Local) volumeBinds(mounts []providers.VolumeMount) ([]jail.VolumeBind, error) {
	var out []jail.VolumeBind
	var problems []string
	for i, m := range mounts {
		src := m.HostPath
		if m.Volume != "" {
			var err error
			if src, err = l.volumeSource(m.Volume); providers.Kind(err) == providers.ErrUnavailable {
				return nil, err
			} else if err != nil {
				problems = append(problems, fmt.Sprintf("volumes[%d]: %s", i, providers.Message(err)))
				continue
			}
		}
		fd, err := jail.OpenBeneath(src, m.SubPath)
		if err != nil {
			problems = append(problems, fmt.Sprintf("volumes[%d].sub_path %q %s", i, m.SubPath, jail.SubPathProblem(err)))
			continue
		}
		unix.Close(fd)
		out = append(out, jail.VolumeBind{Source: src, Sub: m.SubPath, Target: m.MountPath, ReadOnly: m.ReadOnly})
	}
	if len(problems) > 0 {
		return nil, providers.Errorf(providers.ErrInvalid, "%s", strings.Join(problems, "; "))
	}
	return out, nil
}
