package jail

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMkdirInRoot: a volume's target is made inside the sandbox's root
// whatever symlinks the image holds on the way (absolute, or climbing
// with ..), and never outside it.
func TestMkdirInRoot(t *testing.T) {
	outside := t.TempDir()
	root := filepath.Join(t.TempDir(), "root")
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.Symlink("/etc", filepath.Join(root, "abs"))
	os.Symlink("../../../../../../..", filepath.Join(root, "up"))
	os.Symlink(outside, filepath.Join(root, "out"))
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	for target, made := range map[string]string{
		"/data/deep": "data/deep",
		"/abs/vol":   "etc/vol",
		"/up/vol2":   "vol2",
	} {
		fd, err := mkdirInRoot(rfd, target)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		unix.Close(fd)
		if fi, err := os.Stat(filepath.Join(root, made)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %s inside the root is not made: %v", target, made, err)
		}
	}
	// A symlink to a directory the root lacks (its target taken inside
	// the root) is refused, not followed out.
	if fd, err := mkdirInRoot(rfd, "/out/vol3/x"); err == nil {
		unix.Close(fd)
		t.Error("a target through a dangling symlink was made")
	}
	if _, err := os.Stat(filepath.Join(outside, "vol3")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("made outside the root: %v", err)
	}
}

// TestOpenBeneath: a sub_path resolves inside its source, or is refused
// when a symlink on the way leads out (absolute or by ..).
func TestOpenBeneath(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "a", "b"), 0o755)
	os.Symlink("a/b", filepath.Join(src, "inside"))
	os.Symlink("/", filepath.Join(src, "abs"))
	os.Symlink("../..", filepath.Join(src, "a", "up"))
	for sub, want := range map[string]error{
		"": nil, "a/b": nil, "inside": nil,
		"abs": unix.EXDEV, "abs/etc": unix.EXDEV, "a/up": unix.EXDEV, "a/up/x": unix.EXDEV, "missing": unix.ENOENT,
	} {
		fd, err := OpenBeneath(src, sub)
		if err == nil {
			unix.Close(fd)
		}
		if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
			t.Errorf("%q: %v, want %v", sub, err, want)
		}
	}
}
