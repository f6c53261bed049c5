package local

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// Snapshots. A sandbox's own filesystem is btrfs (disk.go) with its upper
// layer in a subvolume; a snapshot is a read-only snapshot of that
// subvolume (snaps/<sid> in the same filesystem, whose upper/ a sandbox
// made from it stacks): O(1), whatever the
// sandbox wrote. A sandbox made from it stacks it, id-mapped and
// read-only, as a layer between its own upper layer and the root image
// (and, for a snapshot of such a sandbox, the layers it stacked itself
// below that): no copy. The filesystems are crash-consistent at the
// snapshot; running processes are not captured.
//
// The image that holds a snapshot is hard-linked into <state>/layers as
// <sandbox id>.img when the first snapshot is taken, so it outlives its
// sandbox. A layer is removed with the last snapshot record and sandbox
// that use it; an image, once none of its layers is used and its sandbox
// is gone. Every mount the provider makes of an image is detached (seen
// by no one) or in a sandbox's mount namespace; all of them share one
// loop device per image, found by the image's inode (a second device
// would be a second, incoherent instance of the same filesystem).

// snapshotRecord is <state>/snapshots/<sid>.json.
type snapshotRecord struct {
	ID      string            `json:"id"`
	Sandbox string            `json:"sandbox"`
	Layers  []jail.Layer      `json:"layers"`        // the newest first
	Env     map[string]string `json:"env,omitempty"` // the source's, for sandboxes made from it
	Created time.Time         `json:"created"`
}

const snapsDir = "snaps"

var _ providers.Snapshotter = (*Local)(nil)

func (l *Local) snapshotsDir() string { return l.stateDir + "/snapshots" }
func (l *Local) layersDir() string    { return l.stateDir + "/layers" }

// snapshotRecord reads snapshot sid's record: ErrNotFound if there is none.
func (l *Local) snapshotRecord(sid string) (snapshotRecord, error) {
	var rec snapshotRecord
	if !idPattern.MatchString(sid) {
		return rec, providers.Errorf(providers.ErrNotFound, "snapshot %s not found", sid)
	}
	b, err := os.ReadFile(l.snapshotsDir() + "/" + sid + ".json")
	if errors.Is(err, os.ErrNotExist) {
		return rec, providers.Errorf(providers.ErrNotFound, "snapshot %s not found", sid)
	}
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		return rec, providers.Wrap(providers.ErrUnavailable, err, "snapshot "+sid)
	}
	if l.isolation != IsolationNamespaces {
		return rec, providers.Errorf(providers.ErrUnsupported, "a sandbox from a snapshot needs isolation %q", IsolationNamespaces)
	}
	return rec, nil
}

// Snapshot takes a read-only snapshot of sandbox id's upper layer as sid
// and returns the space the sandbox's filesystem uses. The sandbox keeps
// running. ErrUnsupported unless the sandbox has its own btrfs filesystem.
func (l *Local) Snapshot(ctx context.Context, id, sid string) (int64, error) {
	if !idPattern.MatchString(sid) {
		return 0, providers.Errorf(providers.ErrInvalid, "invalid snapshot id %q", sid)
	}
	sb, err := l.locked(id)
	if err != nil {
		return 0, err
	}
	defer sb.mu.Unlock()
	switch {
	case sb.st.Isolation != IsolationNamespaces:
		return 0, providers.Errorf(providers.ErrUnsupported, "snapshots need isolation %q", IsolationNamespaces)
	case sb.st.DiskBytes == 0:
		return 0, providers.Errorf(providers.ErrUnsupported, "snapshots need the sandbox's own filesystem: sandbox %s has no disk limit", id)
	case sb.st.DiskFS != jail.FSBtrfs:
		return 0, providers.Errorf(providers.ErrUnsupported, "snapshots need a btrfs disk (install btrfs-progs): sandbox %s's is %s", id, cmp.Or(sb.st.DiskFS, jail.FSExt4))
	}
	if s := sb.state(); s != providers.StateRunning && s != providers.StatePaused {
		return 0, providers.Errorf(providers.ErrConflict, "cannot snapshot sandbox %s: it is %s", id, s)
	}
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	for _, d := range []string{l.snapshotsDir(), l.layersDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return 0, err
		}
	}
	img := l.layersDir() + "/" + id + ".img"
	if err := os.Link(sb.dir+"/"+jail.DiskImage, img); err != nil && !errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("keep sandbox %s's disk: %w", id, err)
	}
	top := jail.Layer{Image: img}
	mfd, err := top.MountWith(0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(mfd)
	root, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(root)
	// Fixed names at the filesystem's root, which the sandbox cannot
	// reach (it sees the inside of upper only).
	if err := unix.Mkdirat(root, snapsDir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return 0, err
	}
	snaps, err := unix.Openat(root, snapsDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(snaps)
	src, err := unix.Openat(root, jail.LayerDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(src)
	if err := jail.BtrfsSnapshot(snaps, src, sid); err != nil {
		return 0, fmt.Errorf("snapshot sandbox %s: %w", id, err)
	}
	rec := snapshotRecord{ID: sid, Sandbox: id, Created: time.Now().UTC(), Env: sb.st.Env,
		Layers: append([]jail.Layer{{Image: img, Subvol: snapsDir + "/" + sid}}, sb.st.Layers...)}
	if err := writeJSON(l.snapshotsDir()+"/"+sid+".json", rec); err != nil {
		jail.BtrfsSubvolDelete(snaps, sid)
		return 0, err
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(root, &fs); err != nil {
		return 0, nil
	}
	return int64(fs.Blocks-fs.Bfree) * fs.Bsize, nil
}

// DeleteSnapshot removes snapshot sid's record and whatever of its layers
// nothing else uses. ErrConflict while a sandbox made from it exists.
func (l *Local) DeleteSnapshot(ctx context.Context, sid string) error {
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	rec, err := l.snapshotRecord(sid)
	if err != nil {
		return err
	}
	for _, st := range l.allStates() {
		if st.Snapshot == sid {
			return providers.Errorf(providers.ErrConflict, "snapshot %s is in use by sandbox %s", sid, st.ID)
		}
	}
	if err := os.Remove(l.snapshotsDir() + "/" + sid + ".json"); err != nil {
		return err
	}
	return l.collect(rec.Layers)
}

// collectSandbox drops what deleted sandbox id kept for snapshots that
// are gone.
func (l *Local) collectSandbox(id string, layers []jail.Layer) {
	img := l.layersDir() + "/" + id + ".img"
	if _, err := os.Stat(img); err != nil && len(layers) == 0 {
		return // never snapshotted, made from no snapshot
	}
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	if err := l.collect(append(layers, jail.Layer{Image: img})); err != nil {
		l.log.Error("local: remove unused snapshot layers", "sandbox", id, "err", err)
	}
}

// collect removes those of the given layers (Subvol "" stands for an
// image as a whole) that no snapshot record and no sandbox uses: the
// subvolume, or the image once none of its layers is used and its sandbox
// is gone (its disk.img link too). l.snapMu is held.
func (l *Local) collect(dropped []jail.Layer) error {
	used := map[jail.Layer]bool{}
	usedImage := map[string]bool{}
	mark := func(ls []jail.Layer) {
		for _, ly := range ls {
			used[ly], usedImage[ly.Image] = true, true
		}
	}
	ents, _ := os.ReadDir(l.snapshotsDir())
	for _, e := range ents {
		if sid, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			if rec, err := l.snapshotRecord(sid); err == nil {
				mark(rec.Layers)
			}
		}
	}
	// Only when a record does not keep one of them is it worth reading
	// every sandbox's state (a sandbox's snapshot normally outlives it).
	if !slices.ContainsFunc(dropped, func(ly jail.Layer) bool {
		return (ly.Subvol == "" && !usedImage[ly.Image]) || (ly.Subvol != "" && !used[ly])
	}) {
		return nil
	}
	for _, st := range l.allStates() {
		mark(st.Layers)
	}
	var errs []error
	done := map[string]bool{}
	for _, ly := range dropped {
		if used[ly] || done[ly.Image] {
			continue
		}
		var fi unix.Stat_t
		if err := unix.Stat(ly.Image, &fi); err != nil {
			continue // gone already
		}
		if !usedImage[ly.Image] && fi.Nlink == 1 {
			// Nothing in it is used and its sandbox is gone.
			errs = append(errs, os.Remove(ly.Image))
			done[ly.Image] = true
			continue
		}
		if ly.Subvol != "" {
			errs = append(errs, destroyLayer(ly))
		}
	}
	return errors.Join(errs...)
}

// allStates reads the state of every sandbox on disk.
func (l *Local) allStates() []persisted {
	ents, _ := os.ReadDir(l.boxesDir)
	out := make([]persisted, 0, len(ents))
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if st, err := readState(filepath.Join(l.boxesDir, e.Name())); err == nil {
			out = append(out, st)
		}
	}
	return out
}

// destroyLayer deletes the layer's subvolume.
func destroyLayer(ly jail.Layer) error {
	mfd, err := jail.Layer{Image: ly.Image}.MountWith(0)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	dir, name := filepath.Split(ly.Subvol)
	d, err := unix.Openat(mfd, cmp.Or(strings.TrimSuffix(dir, "/"), "."), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s in %s: %w", dir, ly.Image, err)
	}
	defer unix.Close(d)
	if err := jail.BtrfsSubvolDelete(d, name); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete %s in %s: %w", ly.Subvol, ly.Image, err)
	}
	return nil
}
