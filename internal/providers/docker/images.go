package docker

import (
	"context"
	"sort"

	"github.com/docker/docker/api/types/image"

	"github.com/sandgate/sandgate/internal/providers"
)

// Images lists the daemon's tagged images, less the gateways' snapshot
// images (a snapshot is created from through snapshot_id, not by name).
func (d *Docker) Images(ctx context.Context) ([]providers.Image, error) {
	sums, err := d.cli.ImageList(ctx, image.ListOptions{})
	if err != nil {
		return nil, providers.Wrap(providers.ErrUnavailable, err, "list the docker daemon's images")
	}
	var out []providers.Image
	for _, s := range sums {
		if _, snap := s.Labels[LabelSnapshot]; snap {
			continue
		}
		for _, t := range s.RepoTags {
			if t != "" && t != "<none>:<none>" {
				out = append(out, providers.Image{Name: t, Source: providers.ImageSourceDocker, SizeBytes: s.Size})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
