package rootfs

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
)

// The busybox test image, as `docker save` writes it, unpacks to a tree
// that runs. Needs a daemon: skips without one, except on CI (CI=true),
// where it fails.
func TestResolveDockerSave(t *testing.T) {
	requireRoot(t)
	cli := dockertest.Client(t)
	ctx := ctxT(t)
	rc, err := cli.ImageSave(ctx, []string{dockertest.ImageRef})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "busybox.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(f, rc)
	rc.Close()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	s := openStore(t)
	start := time.Now()
	img, err := s.Resolve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	unpack := time.Since(start)
	start = time.Now()
	again, err := s.Resolve(ctx, p+":"+dockertest.ImageRef)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("import and unpack %v, cached Resolve %v", unpack, time.Since(start))
	if again.Dir != img.Dir || s.unpacks.Load() != 1 {
		t.Errorf("second Resolve: Dir %s (first %s), %d unpacks", again.Dir, img.Dir, s.unpacks.Load())
	}

	fi, err := os.Lstat(filepath.Join(img.Dir, "bin/busybox"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("bin/busybox: mode %v, want an executable file", fi.Mode())
	}
	if target, err := os.Readlink(filepath.Join(img.Dir, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Errorf("bin/sh -> %q (%v), want /bin/busybox", target, err)
	}
	if b, err := os.ReadFile(filepath.Join(img.Dir, "etc/passwd")); err != nil || !strings.Contains(string(b), "nobody:x:65534") {
		t.Errorf("etc/passwd: %q (%v)", b, err)
	}
	if fi, err := os.Stat(filepath.Join(img.Dir, "tmp")); err != nil || fi.Mode().Perm() != 0o777 || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp: %v (%v), want drwxrwxrwt", fi.Mode(), err)
	}
}
