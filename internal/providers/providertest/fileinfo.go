package providertest

import (
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// testFileInfo: a file, a directory, a symlink (described, not followed),
// the root; a listing sorted by name and capped; the errors.
func (s *suite) testFileInfo(t *testing.T, fl providers.FileLister, id string) {
	s.sh(t, id, "mkdir -p /workspace/info/sub && printf hello > /workspace/info/f.txt && chmod 0640 /workspace/info/f.txt && ln -s f.txt /workspace/info/link && chmod 1777 /workspace/info/sub")
	ctx := ctxT(t, opTimeout)
	fi, err := fl.StatFile(ctx, id, "/workspace/info/f.txt")
	if err != nil || fi.Name != "f.txt" || fi.Type != providers.FileRegular || fi.Size != 5 || fi.Mode != 0o640 {
		t.Errorf("stat of a file: %+v %v", fi, err)
	}
	if age := time.Since(fi.ModTime); age < -time.Minute || age > time.Hour {
		t.Errorf("the file's modification time %v is not about now", fi.ModTime)
	}
	if fi, err := fl.StatFile(ctx, id, "/workspace/info/link"); err != nil || fi.Type != providers.FileSymlink || fi.Target != "f.txt" {
		t.Errorf("stat of a symlink: %+v %v", fi, err)
	}
	if fi, err := fl.StatFile(ctx, id, "/workspace/info/sub"); err != nil || fi.Type != providers.FileDir || fi.Mode != 0o777|fs.ModeSticky {
		t.Errorf("stat of a sticky directory: %+v (mode %v) %v", fi, fi.Mode, err)
	}
	if fi, err := fl.StatFile(ctx, id, "/"); err != nil || fi.Type != providers.FileDir || fi.Name != "/" {
		t.Errorf("stat of the root: %+v %v", fi, err)
	}
	if _, err := fl.StatFile(ctx, id, "/workspace/info/nothing"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("stat of a missing file: %v, want ErrNotFound", err)
	}

	entries, truncated, err := fl.ListDir(ctx, id, "/workspace/info")
	var names []string
	for _, e := range entries {
		names = append(names, e.Name+":"+string(e.Type))
	}
	if err != nil || truncated || !slices.Equal(names, []string{"f.txt:file", "link:symlink", "sub:dir"}) {
		t.Errorf("list: %v truncated %v %v", names, truncated, err)
	}
	if _, _, err := fl.ListDir(ctx, id, "/workspace/info/f.txt"); !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("list of a file: %v, want ErrInvalid", err)
	}
	if _, _, err := fl.ListDir(ctx, id, "/workspace/info/nothing"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("list of a missing directory: %v, want ErrNotFound", err)
	}

	// A symlink that climbs above the root stays in the sandbox: through
	// it, the listing is of the sandbox's own /workspace/info.
	s.sh(t, id, "ln -s ../../../../.. /workspace/up")
	if entries, _, err := fl.ListDir(ctx, id, "/workspace/up/workspace/info"); err != nil || len(entries) != 3 {
		t.Errorf("list through a symlink above the root: %d entries, %v", len(entries), err)
	}
	if fi, err := fl.StatFile(ctx, id, "/workspace/up/workspace/info/f.txt"); err != nil || fi.Size != 5 {
		t.Errorf("stat through a symlink above the root: %+v %v", fi, err)
	}

	// One entry more than a listing holds.
	s.sh(t, id, "mkdir /workspace/many && cd /workspace/many && i=0; while [ $i -le 5000 ]; do : > f$i; i=$((i+1)); done")
	entries, truncated, err = fl.ListDir(ctx, id, "/workspace/many")
	if err != nil || !truncated || len(entries) != providers.MaxDirEntries {
		t.Errorf("list of 5,001 files: %d entries, truncated %v, %v", len(entries), truncated, err)
	}
	if len(entries) > 0 && (entries[0].Name != "f0" || !slices.IsSortedFunc(entries, func(a, b providers.FileInfo) int { return strings.Compare(a.Name, b.Name) })) {
		t.Errorf("list not sorted by name: first %q", entries[0].Name)
	}
}
