package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// requireRoot: unpacking sets ownership, so it needs root (a skip
// outside CI, a failure in CI).
func requireRoot(t testing.TB) {
	t.Helper()
	testkit.RequireRoot(t)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// epoch is the mtime of every test entry unless it sets its own.
var epoch = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

// ent is one tar entry; a zero Mode means 0644 for files, 0755 for
// directories.
type ent struct {
	hdr  tar.Header
	body string
}

func file(name, body string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, body: body}
}

func dir(name string, mode int64) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

func symlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlink(name, target string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

func owned(e ent, uid, gid int) ent {
	e.hdr.Uid, e.hdr.Gid = uid, gid
	return e
}

// tarBytes writes ents as a tar stream.
func tarBytes(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.ModTime.IsZero() {
			h.ModTime = epoch
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.PAXRecords != nil {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layer(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	b := tarBytes(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// image stacks layers (bottom first) under cfg, for linux on this host's
// architecture.
func image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", runtime.GOARCH, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func configDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

func manifestDigest(t testing.TB, img v1.Image) string {
	t.Helper()
	h, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h.String()
}

// writeDocker writes `docker save` style output of imgs, by tag, to a new
// tar and returns its path.
func writeDocker(t testing.TB, imgs map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for tag, img := range imgs {
		ref, err := name.ParseReference(tag)
		if err != nil {
			t.Fatal(err)
		}
		refs[ref] = img
	}
	p := filepath.Join(t.TempDir(), "docker.tar")
	if err := tarball.MultiRefWriteToFile(p, refs); err != nil {
		t.Fatal(err)
	}
	return p
}

// ociImage is an image to put in an OCI layout, with its ref.name
// annotation ("" for none).
type ociImage struct {
	img     v1.Image
	refName string
}

// writeOCI writes an OCI image layout holding imgs as a tar and returns
// its path.
func writeOCI(t testing.TB, imgs ...ociImage) string {
	t.Helper()
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range imgs {
		var opts []layout.Option
		if i.refName != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{annotationRefName: i.refName}))
		}
		if err := lp.AppendImage(i.img, opts...); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, "oci.tar")
	tarDir(t, string(lp), p)
	return p
}

// tarDir writes the tree under dir as a tar at p.
func tarDir(t testing.TB, dir, p string) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(fp string, d fs.DirEntry, err error) error {
		if err != nil || fp == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, fp)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(fp)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

// tree describes every entry under root (not root itself), by relative
// path: "d 0755 0:0", "f 4755 0:0 content", "l 0:0 -> target",
// "p 0620 0:0".
func tree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		perm, own := st.Mode&0o7777, fmt.Sprintf("%d:%d", st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			out[rel] = fmt.Sprintf("d %04o %s", perm, own)
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("f %04o %s %s", perm, own, b)
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("l %s -> %s", own, target)
		case unix.S_IFIFO:
			out[rel] = fmt.Sprintf("p %04o %s", perm, own)
		default:
			out[rel] = fmt.Sprintf("? %o %s", st.Mode, own)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// checkTree fails t with every difference between root's tree and want.
func checkTree(t testing.TB, root string, want map[string]string) {
	t.Helper()
	got := tree(t, root)
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	for k := range want {
		if _, ok := got[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var diffs []string
	for _, k := range keys {
		if got[k] != want[k] {
			diffs = append(diffs, fmt.Sprintf("%s: got %q, want %q", k, got[k], want[k]))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("unpacked tree differs:\n%s", strings.Join(diffs, "\n"))
	}
}

func ino(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// tmpEmpty checks that no unpack is left in the store's tmp.
func tmpEmpty(t testing.TB, s *Store) {
	t.Helper()
	es, err := os.ReadDir(s.tmpDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(es) > 0 {
		t.Errorf("tmp holds %d entries after the unpack", len(es))
	}
}
