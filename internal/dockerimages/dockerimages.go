// Package dockerimages reads the image store of a Docker daemon on this
// host, for the providers that run images without Docker (local): which
// images it has, and one image exported as a `docker save` tarball.
package dockerimages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"
)

// ErrNotFound is an image the daemon does not have.
var ErrNotFound = errors.New("the docker daemon has no such image")

// Daemon is a Docker daemon's image store.
type Daemon struct {
	cli *client.Client
}

// Open returns the daemon at host ("" is DOCKER_HOST, else the local
// socket). Nothing is dialled until a call.
func Open(host string) (*Daemon, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("docker images: %w", err)
	}
	return &Daemon{cli: cli}, nil
}

// Close releases the client's connections.
func (d *Daemon) Close() error { return d.cli.Close() }

// ID is the image id (sha256:<hex>, its config's digest) of the image
// name (repo:tag, an id or a digest reference); ErrNotFound when the
// daemon has none.
func (d *Daemon) ID(ctx context.Context, name string) (string, error) {
	if name == "" || strings.ContainsAny(name, " \t\n") {
		return "", fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	res, err := d.cli.ImageInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("image %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(res.ID, "sha256:") || len(res.ID) != len("sha256:")+64 {
		return "", fmt.Errorf("image %q: unexpected id %q", name, res.ID)
	}
	return res.ID, nil
}

// Save streams the image id as a `docker save` tarball; the caller closes
// it.
func (d *Daemon) Save(ctx context.Context, id string) (io.ReadCloser, error) {
	return d.cli.ImageSave(ctx, []string{id})
}

// Image is one image of the daemon.
type Image struct {
	Names     []string // repo:tag, sorted
	ID        string   // sha256:<hex>
	SizeBytes int64
}

// List is the daemon's tagged images, sorted by first name.
func (d *Daemon) List(ctx context.Context) ([]Image, error) {
	sums, err := d.cli.ImageList(ctx, image.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []Image
	for _, s := range sums {
		var names []string
		for _, t := range s.RepoTags {
			if t != "" && t != "<none>:<none>" {
				names = append(names, t)
			}
		}
		if len(names) == 0 {
			continue
		}
		sort.Strings(names)
		out = append(out, Image{Names: names, ID: s.ID, SizeBytes: s.Size})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Names[0] < out[j].Names[0] })
	return out, nil
}
