package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/testkit"
)

var testConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "A=b"},
	WorkingDir: "/home/user",
	Entrypoint: []string{"/bin/sh"},
	Cmd:        []string{"-c", "true"},
	User:       "1000:1000",
}

// layeredImage is two layers covering what unpacking must get right; its
// flattened tree is layeredTree.
func layeredImage(t testing.TB) v1.Image {
	xattrs := file("etc/keep", "keep", 0o644)
	xattrs.hdr.PAXRecords = map[string]string{
		"SCHILY.xattr.user.test":           "v",
		"SCHILY.xattr.user.overlay.opaque": "y",
		"SCHILY.xattr.trusted.test":        "t",
	}
	fifo := ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o620}}
	null := ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}}
	l1 := layer(t,
		dir("./", 0o755),
		dir("bin/", 0o755),
		file("bin/busybox", "BB", 0o755),
		symlink("bin/sh", "busybox"),
		hardlink("bin/ln", "bin/busybox"),
		file("bin/su", "SU", 0o4755),
		dir("etc/", 0o755),
		file("etc/gone", "deleted by layer 2", 0o644),
		file("etc/motd", "old", 0o644),
		xattrs,
		owned(dir("home/user/", 0o700), 1000, 1000),
		owned(file("home/user/file", "mine", 0o640), 1000, 1000),
		dir("opq/", 0o755),
		file("opq/old", "hidden by layer 2", 0o644),
		null,
		fifo,
	)
	l2 := layer(t,
		file("etc/.wh.gone", "", 0o644),
		file("etc/motd", "new", 0o644),
		file("opq/.wh..wh..opq", "", 0o644),
		file("opq/new", "n", 0o644),
		hardlink("usr/bin/busybox2", "bin/busybox"),
	)
	return image(t, testConfig, l1, l2)
}

var layeredTree = map[string]string{
	"bin":              "d 0755 0:0",
	"bin/busybox":      "f 0755 0:0 BB",
	"bin/ln":           "f 0755 0:0 BB",
	"bin/sh":           "l 0:0 -> busybox",
	"bin/su":           "f 4755 0:0 SU",
	"etc":              "d 0755 0:0",
	"etc/keep":         "f 0644 0:0 keep",
	"etc/motd":         "f 0644 0:0 new",
	"home":             "d 0755 0:0",
	"home/user":        "d 0700 1000:1000",
	"home/user/file":   "f 0640 1000:1000 mine",
	"opq":              "d 0755 0:0",
	"opq/new":          "f 0644 0:0 n",
	"run":              "d 0755 0:0",
	"run/fifo":         "p 0620 0:0",
	"usr":              "d 0755 0:0",
	"usr/bin":          "d 0755 0:0",
	"usr/bin/busybox2": "f 0755 0:0 BB",
}

func TestResolveTarballs(t *testing.T) {
	requireRoot(t)
	img := layeredImage(t)
	for _, tc := range []struct {
		name string
		tar  func(t *testing.T) string
	}{
		{"docker-save", func(t *testing.T) string { return writeDocker(t, map[string]v1.Image{"test/layered:1": img}) }},
		{"oci-layout", func(t *testing.T) string { return writeOCI(t, ociImage{img, "test/layered:1"}) }},
		{"oci-layout-unnamed", func(t *testing.T) string { return writeOCI(t, ociImage{img, ""}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			got, err := s.Resolve(ctxT(t), tc.tar(t))
			if err != nil {
				t.Fatal(err)
			}
			if want := configDigest(t, img); got.Digest != want {
				t.Errorf("Digest %s, want %s", got.Digest, want)
			}
			if want := filepath.Join(s.dir, "sha256", strings.TrimPrefix(got.Digest, "sha256:"), "rootfs"); got.Dir != want {
				t.Errorf("Dir %s, want %s", got.Dir, want)
			}
			want := ImageConfig{Env: testConfig.Env, Workdir: testConfig.WorkingDir, Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd, User: testConfig.User}
			if fmt.Sprint(got.Config) != fmt.Sprint(want) {
				t.Errorf("Config %+v, want %+v", got.Config, want)
			}
			checkTree(t, got.Dir, layeredTree)
			checkLayeredDetails(t, got.Dir)
			tmpEmpty(t, s)
		})
	}
}

// checkLayeredDetails checks what tree does not show: hard links, times,
// xattrs.
func checkLayeredDetails(t *testing.T, root string) {
	t.Helper()
	bb := ino(t, filepath.Join(root, "bin/busybox"))
	for _, l := range []string{"bin/ln", "usr/bin/busybox2"} {
		if ino(t, filepath.Join(root, l)) != bb {
			t.Errorf("%s is not a hard link of bin/busybox", l)
		}
	}
	for _, p := range []string{".", "bin/busybox", "etc", "bin/sh", "home/user"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &st); err != nil {
			t.Fatal(err)
		}
		if got := time.Unix(st.Mtim.Unix()); !got.Equal(epoch) {
			t.Errorf("%s: mtime %v, want %v", p, got.UTC(), epoch)
		}
	}
	keep := filepath.Join(root, "etc/keep")
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(keep, "user.test", buf); err != nil && !errors.Is(err, unix.ENOTSUP) {
		t.Errorf("user.test: %v", err)
	} else if err == nil && string(buf[:n]) != "v" {
		t.Errorf("user.test = %q, want v", buf[:n])
	}
	for _, x := range []string{"user.overlay.opaque", "trusted.test"} {
		if _, err := unix.Lgetxattr(keep, x, buf); !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOTSUP) {
			t.Errorf("%s: kept (err %v), want dropped", x, err)
		}
	}
}

func TestResolveCachesByConfigDigest(t *testing.T) {
	requireRoot(t)
	img := layeredImage(t)
	s := openStore(t)
	var logged bytes.Buffer
	s.Log = slog.New(slog.NewTextHandler(&logged, nil))
	first, err := s.Resolve(ctxT(t), writeDocker(t, map[string]v1.Image{"test/a:1": img}))
	if err != nil {
		t.Fatal(err)
	}
	// An unpack says it started (creates wait on it) and how long it took.
	if l := logged.String(); !strings.Contains(l, "unpacking image") || !strings.Contains(l, "image unpacked") || !strings.Contains(l, "duration=") {
		t.Errorf("unpack log:\n%s", l)
	}
	before := ino(t, first.Dir)
	// The same image in another tarball, in the other format.
	second, err := s.Resolve(ctxT(t), writeOCI(t, ociImage{img, "other"}))
	if err != nil {
		t.Fatal(err)
	}
	if second.Dir != first.Dir || ino(t, second.Dir) != before {
		t.Errorf("second Resolve gave %s (inode %d), want %s (inode %d)", second.Dir, ino(t, second.Dir), first.Dir, before)
	}
	if n := s.unpacks.Load(); n != 1 {
		t.Errorf("%d unpacks, want 1", n)
	}
	// A new Store on the same directory finds it too.
	s2, err := Open(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	third, err := s2.Resolve(ctxT(t), writeDocker(t, map[string]v1.Image{"test/a:1": img}))
	if err != nil {
		t.Fatal(err)
	}
	if third.Dir != first.Dir || ino(t, third.Dir) != before || s2.unpacks.Load() != 0 {
		t.Errorf("reopened store unpacked again (%d) or moved the image", s2.unpacks.Load())
	}
}

func TestResolveConcurrentUnpacksOnce(t *testing.T) {
	requireRoot(t)
	s := openStore(t)
	p := writeDocker(t, map[string]v1.Image{"test/a:1": layeredImage(t)})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	imgs := make([]Image, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Go(func() { imgs[i], errs[i] = s.Resolve(ctx, p) })
	}
	wg.Wait()
	for i := range 4 {
		if errs[i] != nil {
			t.Fatalf("Resolve %d: %v", i, errs[i])
		}
		if imgs[i].Dir != imgs[0].Dir {
			t.Errorf("Resolve %d: Dir %s, want %s", i, imgs[i].Dir, imgs[0].Dir)
		}
	}
	if n := s.unpacks.Load(); n != 1 {
		t.Errorf("%d unpacks, want 1", n)
	}
	checkTree(t, imgs[0].Dir, layeredTree)
	tmpEmpty(t, s)
}

// A waiter whose leader gives up because the leader's ctx ended unpacks
// itself; a waiter whose own ctx ends stops waiting.
func TestEnsureWaiters(t *testing.T) {
	s := openStore(t)
	started, release := make(chan struct{}), make(chan struct{})
	leaderDone := make(chan error, 1)
	go func() {
		leaderDone <- s.ensure(context.Background(), "abc", func(dst string) error {
			close(started)
			<-release
			return fmt.Errorf("unpack: %w", context.Canceled)
		})
	}()
	<-started

	short, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.ensure(short, "abc", func(string) error { t.Error("a cancelled waiter unpacked"); return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled waiter: %v, want context.Canceled", err)
	}

	waiterDone := make(chan error, 1)
	var ran bool
	go func() {
		waiterDone <- s.ensure(context.Background(), "abc", func(dst string) error {
			ran = true
			return os.WriteFile(filepath.Join(dst, "x"), nil, 0o644)
		})
	}()
	testkit.Eventually(t, "the second caller to wait on the flight", 10*time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.flights["abc"].waiters == 1
	})
	close(release)
	if err := <-leaderDone; !errors.Is(err, context.Canceled) {
		t.Errorf("leader: %v, want context.Canceled", err)
	}
	if err := <-waiterDone; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if !ran {
		t.Error("the waiter did not unpack after the leader gave up")
	}
	if _, err := os.Stat(filepath.Join(s.entry("abc"), "rootfs", "x")); err != nil {
		t.Error(err)
	}
	tmpEmpty(t, s)
}

func TestResolveCancelled(t *testing.T) {
	requireRoot(t)
	s := openStore(t)
	p := writeDocker(t, map[string]v1.Image{"test/a:1": layeredImage(t)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Resolve(ctx, p); !errors.Is(err, context.Canceled) {
		t.Fatalf("Resolve with a cancelled ctx: %v, want context.Canceled", err)
	}
	for _, k := range []error{ErrInvalid, ErrNotFound, ErrNotLocal} {
		if _, err := s.Resolve(ctx, p); errors.Is(err, k) {
			t.Errorf("cancelled Resolve is of kind %v", k)
		}
	}
	tmpEmpty(t, s)
	if es, _ := os.ReadDir(filepath.Join(s.dir, "sha256")); len(es) != 0 {
		t.Errorf("a cancelled unpack left %d entries", len(es))
	}
	img, err := s.Resolve(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, img.Dir, layeredTree)
}

func TestOpen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	if err := os.MkdirAll(filepath.Join(dir, "tmp", "abc-123", "rootfs", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmpEmpty(t, s)
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("store mode %v, want 0700", fi.Mode().Perm())
	}
	if _, err := Open("relative"); err == nil {
		t.Error("Open of a relative path succeeded")
	}
}

func TestResolveSelectors(t *testing.T) {
	requireRoot(t)
	a := image(t, v1.Config{Cmd: []string{"a"}}, layer(t, dir("bin/", 0o755), file("bin/a", "a", 0o755)))
	b := image(t, v1.Config{Cmd: []string{"b"}}, layer(t, dir("bin/", 0o755), file("bin/b", "b", 0o755)))
	docker := writeDocker(t, map[string]v1.Image{"test/a:1": a, "test/a:latest": a, "localhost:5000/b:2": b})
	oci := writeOCI(t, ociImage{a, "test/a:1"}, ociImage{b, "2"})
	s := openStore(t)
	for _, tc := range []struct {
		image string
		want  string // Cmd[0], or the error kind
		kind  error
	}{
		{docker, "", ErrInvalid},
		{docker + ":test/a:1", "a", nil},
		{docker + ":docker.io/test/a:latest", "a", nil},
		{docker + ":test/a", "a", nil},
		{docker + ":localhost:5000/b:2", "b", nil},
		{docker + "@" + configDigest(t, b), "b", nil},
		{docker + ":test/c:1", "", ErrNotFound},
		{docker + "@sha256:" + strings.Repeat("0", 64), "", ErrNotFound},
		{docker + "@sha256:xyz", "", ErrInvalid},
		{oci, "", ErrInvalid},
		{oci + ":test/a:1", "a", nil},
		{oci + ":2", "b", nil},
		{oci + "@" + manifestDigest(t, b), "b", nil},
		{oci + "@" + configDigest(t, a), "a", nil},
		{oci + ":3", "", ErrNotFound},
	} {
		got, err := s.Resolve(ctxT(t), tc.image)
		name := strings.TrimPrefix(tc.image, filepath.Dir(tc.image))
		switch {
		case tc.kind != nil && !errors.Is(err, tc.kind):
			t.Errorf("%s: err %v, want %v", name, err, tc.kind)
		case tc.kind == nil && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.kind == nil && (len(got.Config.Cmd) != 1 || got.Config.Cmd[0] != tc.want):
			t.Errorf("%s: Cmd %v, want [%s]", name, got.Config.Cmd, tc.want)
		}
	}
	// Without a selector, the error says what the tarball holds.
	_, err := s.Resolve(ctxT(t), docker)
	for _, w := range []string{"2 images", "test/a:1", "localhost:5000/b:2", ":<repo>:<tag>"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func TestResolveDirectory(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	got, err := s.Resolve(ctxT(t), root+"/./")
	if err != nil {
		t.Fatal(err)
	}
	if got.Dir != root || got.Digest != "" || fmt.Sprint(got.Config) != fmt.Sprint(ImageConfig{}) {
		t.Errorf("Resolve(dir) = %+v, want Dir %s and nothing else", got, root)
	}
	empty := t.TempDir()
	_, err = s.Resolve(ctxT(t), empty)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "neither bin nor usr") {
		t.Errorf("Resolve(empty dir): %v, want ErrInvalid naming bin and usr", err)
	}
}

func TestResolveErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBytes(t, file("manifest.json", "[]", 0o644)))
	zw.Close()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	other := image(t, v1.Config{}, layer(t, file("bin/x", "x", 0o755)))
	cf, _ := other.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	if runtime.GOARCH == "s390x" {
		cf.Architecture = "arm64"
	}
	otherArch := mustConfigFile(t, other, cf)

	s := openStore(t)
	for _, tc := range []struct {
		image string
		kind  error
		msg   string
	}{
		{"", ErrNotLocal, ""},
		{"ubuntu:22.04", ErrNotLocal, ""},
		{"relative/img.tar", ErrNotLocal, ""},
		{"/nonexistent/img.tar", ErrNotFound, "no such file"},
		{"/nonexistent/img.tar:a:1", ErrNotFound, ""},
		{"/nonexistent/img.tar@sha256:" + strings.Repeat("0", 64), ErrNotFound, ""},
		{fifo, ErrInvalid, "neither a directory nor a regular file"},
		{"/dev/null", ErrInvalid, "neither a directory nor a regular file"},
		{write("notar", []byte(strings.Repeat("not a tar archive\n", 100))), ErrInvalid, "not a tar"},
		{write("gz.tar", gz.Bytes()), ErrInvalid, "gzip"},
		{write("plain.tar", tarBytes(t, file("hello", "x", 0o644))), ErrInvalid, "neither docker save"},
		{write("emptymanifest.tar", tarBytes(t, file("manifest.json", "[]", 0o644))), ErrInvalid, "no image"},
		{write("badjson.tar", tarBytes(t, file("manifest.json", "{", 0o644))), ErrInvalid, "manifest.json"},
		{write("noconfig.tar", tarBytes(t, file("manifest.json", `[{"Config":"c.json","Layers":[]}]`, 0o644))), ErrInvalid, "config c.json"},
		{write("ocinolayout.tar", tarBytes(t, file("index.json", `{"schemaVersion":2,"manifests":[]}`, 0o644))), ErrInvalid, "oci-layout"},
		{writeDocker(t, map[string]v1.Image{"test/x:1": otherArch}), ErrInvalid, "this host runs linux/" + runtime.GOARCH},
		{corruptLayerTar(t, dir), ErrInvalid, "does not match its diff_id"},
		{missingLayerTar(t, dir), ErrInvalid, "not in the tarball"},
	} {
		_, err := s.Resolve(ctxT(t), tc.image)
		if !errors.Is(err, tc.kind) || !strings.Contains(fmt.Sprint(err), tc.msg) {
			t.Errorf("Resolve(%q): %v, want %v with %q", tc.image, err, tc.kind, tc.msg)
		}
		for _, k := range []error{ErrNotLocal, ErrNotFound, ErrInvalid} {
			if k != tc.kind && errors.Is(err, k) {
				t.Errorf("Resolve(%q): %v is also %v", tc.image, err, k)
			}
		}
	}
	tmpEmpty(t, s)
	if es, _ := os.ReadDir(filepath.Join(s.dir, "sha256")); len(es) != 0 {
		t.Errorf("failed unpacks left %d entries", len(es))
	}
}

func mustConfigFile(t testing.TB, img v1.Image, cf *v1.ConfigFile) v1.Image {
	t.Helper()
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// dockerTar writes a docker save tarball by hand: one image with config
// cfg (its diff_ids set from diffIDs) and the given layer blobs.
func dockerTar(t testing.TB, p string, diffIDs []string, layers map[string][]byte) string {
	t.Helper()
	var ids []v1.Hash
	var names []string
	for _, d := range diffIDs {
		h, err := v1.NewHash(d)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, h)
	}
	for n := range layers {
		names = append(names, n)
	}
	slices.Sort(names)
	cfg := v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH, RootFS: v1.RootFS{Type: "layers", DiffIDs: ids}}
	cb, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{"test/x:1"}, "Layers": names}})
	if err != nil {
		t.Fatal(err)
	}
	ents := []ent{file("manifest.json", string(mb), 0o644), file("config.json", string(cb), 0o644)}
	for _, n := range names {
		ents = append(ents, file(n, string(layers[n]), 0o644))
	}
	if err := os.WriteFile(p, tarBytes(t, ents...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// corruptLayerTar holds a layer whose content is not what the config's
// diff_id says.
func corruptLayerTar(t testing.TB, dir string) string {
	real := tarBytes(t, file("bin/x", "x", 0o755))
	evil := tarBytes(t, file("bin/x", "evil", 0o755))
	return dockerTar(t, filepath.Join(dir, "corrupt.tar"), []string{sha(real)}, map[string][]byte{"layer.tar": evil})
}

// missingLayerTar lists a layer the tarball does not hold.
func missingLayerTar(t testing.TB, dir string) string {
	p := dockerTar(t, filepath.Join(dir, "missing.tar"), []string{sha([]byte("x"))}, map[string][]byte{"missing/layer.tar": nil})
	// Rewrite without the layer file.
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var ents []ent
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "missing/layer.tar" {
			continue
		}
		var body bytes.Buffer
		body.ReadFrom(tr)
		ents = append(ents, file(h.Name, body.String(), 0o644))
	}
	if err := os.WriteFile(p, tarBytes(t, ents...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// docker save links a layer it already wrote instead of writing it again.
func TestResolveDockerSaveSymlinkedLayer(t *testing.T) {
	requireRoot(t)
	l := tarBytes(t, dir("bin/", 0o755), file("bin/x", "x", 0o755))
	cfg := v1.ConfigFile{OS: "linux", RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{mustHash(t, sha(l))}}}
	cb, _ := json.Marshal(cfg)
	p := filepath.Join(t.TempDir(), "linked.tar")
	b := tarBytes(t,
		file("manifest.json", `[{"Config":"config.json","RepoTags":["test/x:1"],"Layers":["bbb/layer.tar"]}]`, 0o644),
		file("config.json", string(cb), 0o644),
		file("aaa/layer.tar", string(l), 0o644),
		symlink("bbb/layer.tar", "../aaa/layer.tar"),
	)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	img, err := s.Resolve(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, img.Dir, map[string]string{"bin": "d 0755 0:0", "bin/x": "f 0755 0:0 x"})
}

func mustHash(t testing.TB, s string) v1.Hash {
	t.Helper()
	h, err := v1.NewHash(s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A multi-platform index in an OCI layout resolves to this platform's
// image.
func TestResolveOCIMultiPlatform(t *testing.T) {
	requireRoot(t)
	here := image(t, v1.Config{Cmd: []string{"here"}}, layer(t, dir("bin/", 0o755), file("bin/here", "h", 0o755)))
	other := image(t, v1.Config{Cmd: []string{"other"}}, layer(t, dir("bin/", 0o755), file("bin/other", "o", 0o755)))
	otherArch := "s390x"
	if runtime.GOARCH == otherArch {
		otherArch = "arm64"
	}
	cf, _ := other.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = otherArch
	other = mustConfigFile(t, other, cf)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: otherArch}}},
		mutate.IndexAddendum{Add: here, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}},
	)
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: "test/multi:1"})); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "multi.tar")
	tarDir(t, string(lp), p)
	s := openStore(t)
	for _, im := range []string{p, p + ":test/multi:1"} {
		got, err := s.Resolve(ctxT(t), im)
		if err != nil {
			t.Fatal(err)
		}
		if got.Digest != configDigest(t, here) {
			t.Errorf("Resolve(%s) gave %s, want this platform's image %s", filepath.Base(im), got.Digest, configDigest(t, here))
		}
		checkTree(t, got.Dir, map[string]string{"bin": "d 0755 0:0", "bin/here": "f 0755 0:0 h"})
	}
}

// Layers are decompressed by what they hold: here zstd.
func TestResolveZstdLayer(t *testing.T) {
	requireRoot(t)
	b := tarBytes(t, dir("bin/", 0o755), file("bin/z", "z", 0o755))
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompression(compression.ZStd))
	if err != nil {
		t.Fatal(err)
	}
	img := image(t, v1.Config{}, l)
	s := openStore(t)
	got, err := s.Resolve(ctxT(t), writeOCI(t, ociImage{img, ""}))
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, got.Dir, map[string]string{"bin": "d 0755 0:0", "bin/z": "f 0755 0:0 z"})
}
