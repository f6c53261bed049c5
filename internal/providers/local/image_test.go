package local

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sandgate/sandgate/internal/dockerimages"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// busybox is the static busybox of Debian's busybox-static (what the
// Docker tests build their images from).
func busybox(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("/bin/busybox")
	testkit.Need(t, "/bin/busybox (busybox-static)", err)
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
// directory and names that are no image there are refused.
func TestImages(t *testing.T) {
	t.Parallel()
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
	if err := l.CheckImage(ctxT(t), "bb.tar"); err != nil {
		t.Errorf("CheckImage of a tarball there: %v", err)
	}
	testUnknownImage(t, l, "bb-dir", "bb.tar")
}

// testUnknownImage: an image that is not in l's image directory (a
// registry reference, as a new user would try) is refused with a detail
// that lists what the directory has (want) and how to add one, and
// nothing is made; CheckImage (warm pools) refuses it the same way.
func testUnknownImage(t *testing.T, l *Local, want ...string) {
	t.Helper()
	before, _ := os.ReadDir(l.boxesDir)
	for _, image := range []string{"python:3.13-slim", "docker.io/library/python:3.13-slim", "missing.tar", "../x"} {
		id := providertest.NewID()
		_, err := l.Create(ctxT(t), providers.CreateSpec{ID: id, Workdir: "/workspace", Image: image, ReadyTimeout: defaultReadyTimeout})
		if err == nil {
			l.Delete(ctxT(t), id)
		}
		if !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("image %q: %v, want ErrInvalid", image, err)
			continue
		}
		msg := err.Error()
		for _, s := range append([]string{strconv.Quote(image), "docker save", "--local-images", "leave image unset"}, want...) {
			if !strings.Contains(msg, s) {
				t.Errorf("image %q: the error does not say %q: %s", image, s, msg)
			}
		}
		if strings.Contains(msg, l.images) {
			t.Errorf("image %q: the error names the host path %s: %s", image, l.images, msg)
		}
		if err := l.CheckImage(ctxT(t), image); !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("CheckImage(%q): %v, want ErrInvalid", image, err)
		}
	}
	if after, _ := os.ReadDir(l.boxesDir); len(after) != len(before) {
		t.Errorf("a refused create left sandbox directories: %d before, %d after", len(before), len(after))
	}
	if err := l.CheckImage(ctxT(t), ""); err != nil {
		t.Errorf("CheckImage of no image (the host view): %v", err)
	}
}

// TestImageWithoutDirectory: with no image directory (or isolation
// "none", which runs host processes), every image is refused clearly;
// no image keeps the host's view.
func TestImageWithoutDirectory(t *testing.T) {
	for _, opts := range []Options{{}, {Isolation: IsolationNone, Images: t.TempDir()}} {
		l := newLocal(t, opts)
		_, err := l.Create(ctxT(t), providers.CreateSpec{ID: providertest.NewID(), Workdir: "/workspace", Image: "python:3.13-slim"})
		if !errors.Is(err, providers.ErrInvalid) || !strings.Contains(err.Error(), "leave image unset") {
			t.Errorf("isolation %q: %v, want ErrInvalid saying to leave image unset", l.isolation, err)
		}
		if entries, _ := os.ReadDir(l.boxesDir); len(entries) != 0 {
			t.Errorf("isolation %q: a refused create left %d sandbox directories", l.isolation, len(entries))
		}
		id := create(t, l, providers.CreateSpec{})
		if got, code := sh(t, l, id, "test -x /bin/sh && echo host-view"); got != "host-view\n" || code != 0 {
			t.Errorf("isolation %q without an image: %q %d", l.isolation, got, code)
		}
	}
}

// TestDockerStoreImage: an image the directory lacks but the local docker
// daemon has runs from the daemon's store, exported once and unpacked
// once (a second create reuses both); the directory wins over the daemon
// for a name both have; a name neither has is the clear refusal naming
// both; a name that is no image reference never reaches the daemon.
func TestDockerStoreImage(t *testing.T) {
	t.Parallel()
	ref := dockertest.Image(t)
	d, err := dockerimages.Open("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	images := t.TempDir()
	l := newLocal(t, Options{Images: images, DockerImages: d})
	id := create(t, l, providers.CreateSpec{Image: ref})
	if got, code := sh(t, l, id, "test -e /usr/bin/python3 || echo no-host; /bin/busybox true && echo busybox"); got != "no-host\nbusybox\n" || code != 0 {
		t.Fatalf("the daemon's %s: %q %d", ref, got, code)
	}
	exports := func() []string {
		entries, err := os.ReadDir(l.dockerImages.dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}
	first := exports()
	if len(first) != 1 || !strings.HasSuffix(first[0], ".tar") {
		t.Fatalf("exports after one create: %q", first)
	}
	st1, _ := os.Stat(filepath.Join(l.dockerImages.dir, first[0]))
	create(t, l, providers.CreateSpec{Image: ref})
	if again := exports(); len(again) != 1 || again[0] != first[0] {
		t.Errorf("exports after a second create: %q", again)
	}
	if st2, _ := os.Stat(filepath.Join(l.dockerImages.dir, first[0])); !st2.ModTime().Equal(st1.ModTime()) {
		t.Error("the second create exported the image again")
	}

	// The directory first: a tarball named like the daemon's image wins.
	dirName := strings.ReplaceAll(ref, "/", "-")
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(busyboxLayer(t, map[string]string{"which": "directory wins\n"}))), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("sandgate-test/dir:1")
	if err := tarball.WriteToFile(filepath.Join(images, dirName), tag, img); err != nil {
		t.Fatal(err)
	}
	id = create(t, l, providers.CreateSpec{Image: dirName})
	if got, _ := sh(t, l, id, "cat /which"); got != "directory wins\n" {
		t.Errorf("a name in the directory: %q", got)
	}

	// The list: the directory's entry, then the daemon's images it does
	// not shadow.
	list, err := l.Images(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, im := range list {
		sources[im.Name] = im.Source
	}
	if sources[dirName] != providers.ImageSourceDirectory || sources[ref] != providers.ImageSourceDocker || list[0].Name != dirName {
		t.Errorf("Images: %+v", list)
	}

	testUnknownImage(t, l, dirName)
	_, err = l.Create(ctxT(t), providers.CreateSpec{ID: providertest.NewID(), Workdir: "/workspace", Image: "sandgate-test/none-such:1"})
	if !errors.Is(err, providers.ErrInvalid) || !strings.Contains(err.Error(), "nor has the local docker daemon") {
		t.Errorf("an image neither has: %v", err)
	}
	// Path-like names are answered from the directory's side alone.
	for _, bad := range []string{"../../containers/json", "a b", "x/../../../info"} {
		if img, found, err := l.dockerImage(ctxT(t), bad); found || err != nil || img.Dir != "" {
			t.Errorf("%q reached the daemon: %v %v", bad, found, err)
		}
	}
}
