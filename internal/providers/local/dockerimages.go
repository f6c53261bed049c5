package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/distribution/reference"
	"golang.org/x/sync/singleflight"

	"github.com/sandgate/sandgate/internal/dockerimages"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/rootfs"
)

// Images of the local Docker daemon (Options.DockerImages): a create that
// names an image the image directory lacks gets the daemon's image of that
// name, exported once as a `docker save` tarball into
// <StateDir>/docker-images/<id>.tar (its id is its config's digest, so a
// retagged name is a new export and an unchanged one never is) and
// unpacked once into the image cache like any tarball.

// dockerAsk bounds one question to the daemon (is it there, which id):
// a daemon that does not answer must not hold a create.
const dockerAsk = 5 * time.Second

// dockerProgressEvery is how often a long export logs its progress.
const dockerProgressEvery = 5 * time.Second

type dockerImages struct {
	d       *dockerimages.Daemon
	dir     string // <StateDir>/docker-images
	exports singleflight.Group
}

// dockerImage resolves name from the daemon. found is false when the
// daemon is absent, unreachable or has no such image (the caller answers
// with the image directory's error); err is set when it has the image but
// it could not be exported or unpacked.
func (l *Local) dockerImage(ctx context.Context, name string) (img rootfs.Image, found bool, err error) {
	di := l.dockerImages
	if di == nil {
		return img, false, nil
	}
	// Only a well-formed reference reaches the daemon's API (no paths).
	if _, err := reference.ParseNormalizedNamed(name); err != nil {
		if _, err := reference.ParseAnyReference(name); err != nil {
			return img, false, nil
		}
	}
	actx, cancel := context.WithTimeout(ctx, dockerAsk)
	id, err := di.d.ID(actx, name)
	cancel()
	if errors.Is(err, dockerimages.ErrNotFound) {
		return img, false, nil
	}
	if err != nil {
		l.log.Debug("local: the docker daemon's images are out of reach", "image", name, "err", err)
		return img, false, nil
	}
	tar := filepath.Join(di.dir, strings.TrimPrefix(id, "sha256:")+".tar")
	if _, err := os.Lstat(tar); err != nil {
		// One export per image, however many creates wait for it.
		if _, err, _ := di.exports.Do(id, func() (any, error) {
			return nil, l.exportDockerImage(ctx, name, id, tar)
		}); err != nil {
			return img, true, fmt.Errorf("image %q from the docker daemon: %w", name, err)
		}
	}
	img, err = l.store.Resolve(ctx, tar)
	return img, true, err
}

// exportDockerImage writes the daemon's image id to tar (through a
// temporary file, renamed when complete), logging its progress.
func (l *Local) exportDockerImage(ctx context.Context, name, id, tar string) error {
	if _, err := os.Lstat(tar); err == nil {
		return nil // a flight that ended just before this one began
	}
	if err := os.MkdirAll(l.dockerImages.dir, 0o700); err != nil {
		return err
	}
	start := time.Now()
	l.log.Info("exporting image from the docker daemon (creates of it wait)", "image", name, "id", id)
	rc, err := l.dockerImages.d.Save(ctx, id)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.CreateTemp(l.dockerImages.dir, ".export-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename: nothing
	var n atomic.Int64
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(dockerProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				l.log.Info("exporting image from the docker daemon", "image", name, "bytes", n.Load(), "elapsed", time.Since(start).Round(time.Second))
			}
		}
	}()
	_, err = io.Copy(f, &countingReader{r: rc, n: &n})
	close(done)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), tar)
	}
	if err != nil {
		l.log.Warn("export image from the docker daemon failed", "image", name, "err", err)
		return err
	}
	l.log.Info("image exported from the docker daemon", "image", name, "bytes", n.Load(), "duration", time.Since(start).Round(time.Millisecond))
	return nil
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// Images lists the image directory's entries, then the docker daemon's
// tagged images not shadowed by one of them (the daemon is skipped, with
// a log line, when it does not answer).
func (l *Local) Images(ctx context.Context) ([]providers.Image, error) {
	var out []providers.Image
	seen := map[string]bool{}
	for _, n := range l.imageNames() {
		out = append(out, providers.Image{Name: n, Source: providers.ImageSourceDirectory})
		seen[n] = true
	}
	if l.dockerImages == nil {
		return out, nil
	}
	actx, cancel := context.WithTimeout(ctx, dockerAsk)
	defer cancel()
	list, err := l.dockerImages.d.List(actx)
	if err != nil {
		l.log.Debug("local: the docker daemon's images are out of reach", "err", err)
		return out, nil
	}
	for _, im := range list {
		for _, n := range im.Names {
			if !seen[n] {
				out = append(out, providers.Image{Name: n, Source: providers.ImageSourceDocker, SizeBytes: im.SizeBytes})
			}
		}
	}
	return out, nil
}
