package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// marker is a name unique to this test binary, so a file that escaped
// would be found by name in /, /tmp or /etc.
var marker = fmt.Sprintf("sandgate-escape-%d", os.Getpid())

// noEscape fails t if anything named after marker exists in the host
// places a hostile image aims at, or if the host's /etc/passwd gained a
// link or /etc and /tmp changed mode.
func noEscape(t *testing.T) {
	t.Helper()
	var passwd, etc, tmp unix.Stat_t
	for p, st := range map[string]*unix.Stat_t{"/etc/passwd": &passwd, "/etc": &etc, "/tmp": &tmp} {
		if err := unix.Lstat(p, st); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{"/", "/tmp", "/etc"} {
			es, err := os.ReadDir(d)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if strings.Contains(e.Name(), marker) {
					t.Errorf("escaped: %s", filepath.Join(d, e.Name()))
					os.RemoveAll(filepath.Join(d, e.Name()))
				}
			}
		}
		var st unix.Stat_t
		if unix.Lstat("/etc/passwd", &st); st.Nlink != passwd.Nlink || st.Mode != passwd.Mode {
			t.Errorf("/etc/passwd changed: nlink %d→%d, mode %o→%o", passwd.Nlink, st.Nlink, passwd.Mode, st.Mode)
		}
		for p, before := range map[string]uint32{"/etc": etc.Mode, "/tmp": tmp.Mode} {
			if unix.Lstat(p, &st); st.Mode != before {
				t.Errorf("%s mode changed: %o→%o", p, before, st.Mode)
			}
		}
	})
}

// onlyTarget fails t unless parent holds nothing but its "target".
func onlyTarget(t *testing.T, parent string) {
	t.Helper()
	es, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Name() != "target" {
			t.Errorf("written beside the target: %s", e.Name())
		}
	}
}

func m(s string) string { return strings.ReplaceAll(s, "M", marker) }

// The stream written as is, without mutate.Extract's checks: every name
// and link lands inside the target.
func TestUnpackHostileStream(t *testing.T) {
	requireRoot(t)
	noEscape(t)
	parent := t.TempDir()
	target := filepath.Join(parent, "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	stream := tarBytes(t,
		file(m("../../escape-M"), "1", 0o644),
		file(m("/abs-M"), "2", 0o644),
		dir("tmp/", 0o1777),
		symlink("d", "/tmp"),
		file(m("d/x-M"), "3", 0o644),
		symlink("up", "../../../../../../tmp"),
		file(m("up/y-M"), "4", 0o644),
		dir("etc/", 0o755),
		symlink("s", "/etc"),
		dir("s/", 0o777), // must not chmod what s points at
		file(m("s/passwd-M"), "5", 0o644),
		hardlink("h", "../../../etc/passwd"), // root/etc/passwd: missing, dropped
		hardlink("h2", "/etc/passwd"),
		hardlink("h3", m("d/x-M")), // through the symlink, inside
		file(m("d/x-M"), "again", 0o644),
		ent{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3}},
		ent{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8}},
	)
	if err := unpack(context.Background(), bytes.NewReader(stream), target); err != nil {
		t.Fatal(err)
	}
	checkTree(t, target, map[string]string{
		m("escape-M"):     "f 0644 0:0 1",
		m("abs-M"):        "f 0644 0:0 2",
		"tmp":             "d 1777 0:0",
		m("tmp/x-M"):      "f 0644 0:0 3",
		m("tmp/y-M"):      "f 0644 0:0 4",
		"d":               "l 0:0 -> /tmp",
		"up":              "l 0:0 -> ../../../../../../tmp",
		"etc":             "d 0755 0:0",
		m("etc/passwd-M"): "f 0644 0:0 5",
		"s":               "l 0:0 -> /etc",
		"h3":              "f 0644 0:0 3",
	})
	if ino(t, filepath.Join(target, "h3")) != ino(t, filepath.Join(target, m("tmp/x-M"))) {
		t.Error("h3 is not a hard link of tmp/x")
	}
	onlyTarget(t, parent)
}

// Entries that cannot be placed fail the unpack (ErrInvalid) and write
// nothing outside.
func TestUnpackUnplaceable(t *testing.T) {
	requireRoot(t)
	noEscape(t)
	for name, ents := range map[string][]ent{
		"dangling symlink parent": {symlink("dl", m("/nowhere-M")), file("dl/z", "z", 0o644)},
		"dangling relative":       {symlink("dl", m("../nowhere-M")), file("dl/a/z", "z", 0o644)},
		"file as parent":          {file("f", "f", 0o644), file("f/g", "g", 0o644)},
		"hard link to dir":        {dir("a/", 0o755), hardlink("b", "a")},
		"hard link to root":       {hardlink("b", "/")},
		"uid out of range":        {owned(file("f", "f", 0o644), -5, 0)},
	} {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			target := filepath.Join(parent, "target")
			if err := os.Mkdir(target, 0o755); err != nil {
				t.Fatal(err)
			}
			err := unpack(context.Background(), bytes.NewReader(tarBytes(t, ents...)), target)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("unpack: %v, want ErrInvalid", err)
			}
			onlyTarget(t, parent)
		})
	}
}

// Through Resolve, mutate.Extract refuses "../" names outright, drops
// relative links that climb out and entries below a symlink; what it
// passes on lands inside.
func TestResolveHostileImages(t *testing.T) {
	requireRoot(t)
	noEscape(t)
	s := openStore(t)
	escape := image(t, v1.Config{}, layer(t, dir("bin/", 0o755), file(m("../../escape-M"), "x", 0o644)))
	if _, err := s.Resolve(ctxT(t), writeDocker(t, map[string]v1.Image{"test/escape:1": escape})); !errors.Is(err, ErrInvalid) {
		t.Errorf("image with ../../escape: %v, want ErrInvalid", err)
	}

	tricks := image(t, v1.Config{}, layer(t,
		file(m("/abs-M"), "1", 0o644),
		dir("tmp/", 0o1777),
		symlink("d", "/tmp"),
		file(m("d/x-M"), "2", 0o644),
		symlink("e", "../../../../../../tmp"),
		file(m("e/y-M"), "3", 0o644),
		dir("etc/", 0o755),
		symlink("s", "/etc"),
		file(m("s/passwd-M"), "4", 0o644),
		hardlink("h", "/etc/passwd"),
		hardlink("h2", "../../../../etc/passwd"),
	))
	img, err := s.Resolve(ctxT(t), writeDocker(t, map[string]v1.Image{"test/tricks:1": tricks}))
	if err != nil {
		t.Fatal(err)
	}
	checkTree(t, img.Dir, map[string]string{
		m("abs-M"): "f 0644 0:0 1",
		"tmp":      "d 1777 0:0",
		"d":        "l 0:0 -> /tmp",
		"e":        "d 0755 0:0", // the climbing symlink was dropped
		m("e/y-M"): "f 0644 0:0 3",
		"etc":      "d 0755 0:0",
		"s":        "l 0:0 -> /etc",
	})
	onlyStore(t, s)
}

// onlyStore fails t if anything but the store is beside it.
func onlyStore(t *testing.T, s *Store) {
	t.Helper()
	es, err := os.ReadDir(filepath.Dir(s.dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Name() != filepath.Base(s.dir) {
			t.Errorf("written beside the store: %s", e.Name())
		}
	}
}

// fuzzNames and fuzzLinks are what FuzzUnpack builds entries from: names
// and link targets that climb, are absolute, or go through symlinks.
var (
	fuzzNames = []string{"a", "a/b", "../a", "/a", "l", "l/a", "l/b/c", "l/../../a", "..", ".", "tmp/a", "m/a", "m"}
	fuzzLinks = []string{"/", "/tmp", "..", "../..", "a", "l", "/nowhere", "/tmp/a", "l/a", "/etc/passwd", "m/../.."}
)

// FuzzUnpack unpacks streams of entries built from fuzzNames and
// fuzzLinks: whatever succeeds or fails, nothing is written beside the
// target, and a failure is ErrInvalid. Names carry the marker, so noEscape
// would find an escape in / or /tmp.
func FuzzUnpack(f *testing.F) {
	f.Add([]byte{2, 4, 1, 0, 5, 0})                // l -> /tmp, file l/a
	f.Add([]byte{2, 4, 2, 0, 6, 0})                // l -> .., file l/b/c
	f.Add([]byte{2, 12, 10, 1, 11, 0, 0, 7, 0})    // m -> m/../.., dir m/a, file l/../../a
	f.Add([]byte{0, 0, 0, 3, 1, 4, 2, 4, 0, 0, 5}) // file a, hardlink a/b -> l, ...
	f.Fuzz(func(t *testing.T, b []byte) {
		requireRoot(t)
		noEscape(t)
		var ents []ent
		for i := 0; i+2 < len(b) && len(ents) < 32; i += 3 {
			name := fuzzNames[int(b[i+1])%len(fuzzNames)]
			name = strings.ReplaceAll(name, "a", "a"+marker)
			link := fuzzLinks[int(b[i+2])%len(fuzzLinks)]
			switch b[i] % 5 {
			case 0:
				ents = append(ents, file(name, "x", 0o644))
			case 1:
				ents = append(ents, dir(name, 0o777))
			case 2:
				ents = append(ents, symlink(name, link))
			case 3:
				ents = append(ents, hardlink(name, strings.ReplaceAll(link, "a", "a"+marker)))
			case 4:
				ents = append(ents, ent{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: name, Mode: 0o600}})
			}
		}
		parent := t.TempDir()
		target := filepath.Join(parent, "target")
		if err := os.Mkdir(target, 0o755); err != nil {
			t.Fatal(err)
		}
		err := unpack(context.Background(), bytes.NewReader(tarBytes(t, ents...)), target)
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("unpack: %v, want nil or ErrInvalid", err)
		}
		onlyTarget(t, parent)
	})
}
