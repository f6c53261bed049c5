package local

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// busybox is the static busybox of Debian's busybox-static (what the
// Docker tests build their images from).
func busybox(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("/bin/busybox")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("busybox-static is needed: %v", err)
		}
		t.Skipf("no /bin/busybox: %v", err)
	}
	return b
}

// busyboxLayer is a tar of a minimal root: busybox as bin/sh, and extra
// files.
func busyboxLayer(t *testing.T, extra map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	bb := busybox(t)
	add := func(h *tar.Header, data []byte) {
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bb)
	for _, l := range []string{"sh", "cat", "echo", "ls", "test", "id", "stat", "touch"} {
		add(&tar.Header{Name: "bin/" + l, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	add(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	for p, c := range extra {
		add(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644}, []byte(c))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImages: a create may name a root filesystem directory or a docker
// save tarball in the image directory; the sandbox then runs that image
// (and sees nothing of the host's system directories). Paths outside the
// directory are refused; other names are ignored, as before images.
func TestImages(t *testing.T) {
	images := t.TempDir()
	// A root filesystem directory.
	dir := filepath.Join(images, "bb-dir")
	tr := tar.NewReader(bytes.NewReader(busyboxLayer(t, map[string]string{"which": "directory\n"})))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o755)
		case tar.TypeSymlink:
			os.Symlink(h.Linkname, p)
		default:
			data, _ := io.ReadAll(tr)
			os.WriteFile(p, data, os.FileMode(h.Mode))
		}
	}
	// A docker save tarball with an environment.
	layerData := busyboxLayer(t, map[string]string{"which": "tarball\n"})
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerData)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}})
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("sandgate-test/bb:1")
	if err := tarball.WriteToFile(filepath.Join(images, "bb.tar"), tag, img); err != nil {
		t.Fatal(err)
	}

	l := newLocal(t, Options{Images: images})
	for _, c := range []struct{ image, want string }{
		{"bb-dir", "directory\n"},
		{images + "/bb-dir", "directory\n"},
		{"bb.tar", "tarball\nyes\n"},
		{"bb.tar:sandgate-test/bb:1", "tarball\nyes\n"},
	} {
		id := create(t, l, providers.CreateSpec{Image: c.image})
		if got, code := sh(t, l, id, "cat /which; test -z \"$FROM_IMAGE\" || echo $FROM_IMAGE"); got != c.want || code != 0 {
			t.Errorf("%s: %q %d, want %q", c.image, got, code, c.want)
		}
		if got, _ := sh(t, l, id, "test -e /usr/bin/python3 || echo no-host; stat -c %u:%g /bin/busybox; touch /bin/new && echo writable"); got != "no-host\n0:0\nwritable\n" {
			t.Errorf("%s: %q", c.image, got)
		}
	}
	for _, bad := range []string{"/etc", images + "/../x", images + "/missing.tar"} {
		_, err := l.Create(ctxT(t), providers.CreateSpec{ID: providertest.NewID(), Workdir: "/workspace", Image: bad})
		if !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("image %q: %v, want ErrInvalid", bad, err)
		}
	}
	id := providertest.NewID()
	sb, err := l.Create(ctxT(t), providers.CreateSpec{ID: id, Workdir: "/workspace", Image: "python:3.12-slim", ReadyTimeout: defaultReadyTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Delete(ctxT(t), id) })
	if s, _ := sb.Extra["image"].(string); !strings.HasPrefix(s, "ignored") {
		t.Errorf("a registry image on local: extra %v", sb.Extra)
	}
}
