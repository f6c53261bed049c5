package local

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// TestSnapshotLayers: a snapshot is a layer forks stack with their own
// upper; each sees the source as of the snapshot (files, deletions,
// owners), writes stay where they are made, forks outlive the source and
// the provider, a fork's snapshot carries its own layers, and the layers
// go with their last user.
func TestSnapshotLayers(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	l := newLocal(t, Options{StateDir: stateDir})
	if l.diskFS != jail.FSBtrfs {
		if os.Getenv("CI") == "true" {
			t.Fatalf("disk filesystem %q: the snapshot tests need btrfs-progs", l.diskFS)
		}
		t.Skip("the snapshot tests need btrfs-progs")
	}
	src := create(t, l, providers.CreateSpec{})
	if out, code := sh(t, l, src, `set -e; echo a > /workspace/a; echo b > /workspace/b
		touch /workspace/owned; chown 1000:1000 /workspace/owned
		rm /etc/hosts; mkdir -p /var/lib/new; echo n > /var/lib/new/f`); code != 0 {
		t.Fatalf("prepare source: %s", out)
	}
	size, err := l.Snapshot(ctxT(t), src, "snp-one")
	if err != nil {
		t.Fatal(err)
	}
	if size <= 0 {
		t.Errorf("snapshot size %d", size)
	}
	if _, err := l.Snapshot(ctxT(t), src, "snp-one"); err == nil {
		t.Error("a second snapshot with the same id succeeded")
	}
	sh(t, l, src, "echo after > /workspace/a")

	forks := []string{
		create(t, l, providers.CreateSpec{Snapshot: "snp-one"}),
		create(t, l, providers.CreateSpec{Snapshot: "snp-one"}),
	}
	const view = `cat /workspace/a /workspace/b /var/lib/new/f; stat -c %u:%g /workspace/owned; test -e /etc/hosts && echo hosts-exists; true`
	for _, f := range forks {
		if got, _ := sh(t, l, f, view); got != "a\nb\nn\n1000:1000\n" {
			t.Errorf("fork %s sees %q", f, got)
		}
	}
	sh(t, l, forks[0], "echo f0 > /workspace/a; rm /workspace/b; echo c > /workspace/c")
	if got, _ := sh(t, l, forks[1], "cat /workspace/a /workspace/b; test -e /workspace/c && echo c-exists; true"); got != "a\nb\n" {
		t.Errorf("a fork sees its sibling's writes: %q", got)
	}
	if got, _ := sh(t, l, src, "cat /workspace/a /workspace/b; test -e /workspace/c && echo c-exists; true"); got != "after\nb\n" {
		t.Errorf("the source sees a fork's writes: %q", got)
	}

	// A snapshot of a fork holds the fork's layers below its own.
	if _, err := l.Snapshot(ctxT(t), forks[0], "snp-two"); err != nil {
		t.Fatal(err)
	}
	grand := create(t, l, providers.CreateSpec{Snapshot: "snp-two"})
	if got, _ := sh(t, l, grand, "cat /workspace/a /workspace/c /var/lib/new/f; test -e /workspace/b && echo b-exists; true"); got != "f0\nc\nn\n" {
		t.Errorf("fork of a fork sees %q", got)
	}

	if err := l.DeleteSnapshot(ctxT(t), "snp-one"); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("DeleteSnapshot with live forks: %v, want ErrConflict", err)
	}
	if err := l.DeleteSnapshot(ctxT(t), "snp-none"); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("DeleteSnapshot of an unknown snapshot: %v, want ErrNotFound", err)
	}
	if _, err := l.Create(ctxT(t), providers.CreateSpec{ID: providertest.NewID(), Snapshot: "snp-none"}); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Create from an unknown snapshot: %v, want ErrNotFound", err)
	}

	// The source goes; its forks and its snapshot stay.
	if err := l.Delete(ctxT(t), src); err != nil {
		t.Fatal(err)
	}
	if got, _ := sh(t, l, forks[1], view); got != "a\nb\nn\n1000:1000\n" {
		t.Errorf("fork after the source's delete sees %q", got)
	}
	// A new provider on the same state directory makes forks from it.
	l.Close()
	l2 := newLocal(t, Options{StateDir: stateDir})
	late := create(t, l2, providers.CreateSpec{Snapshot: "snp-one"})
	if got, _ := sh(t, l2, late, view); got != "a\nb\nn\n1000:1000\n" {
		t.Errorf("fork made after a restart sees %q", got)
	}

	// Layers go with their last user: snp-two needs snp-one's layer even
	// once snp-one is deleted.
	for _, id := range append(forks, late) {
		if err := l2.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := l2.DeleteSnapshot(ctxT(t), "snp-one"); err != nil {
		t.Fatalf("DeleteSnapshot once unused: %v", err)
	}
	again := create(t, l2, providers.CreateSpec{Snapshot: "snp-two"})
	if got, _ := sh(t, l2, again, "cat /workspace/a /var/lib/new/f"); got != "f0\nn\n" {
		t.Errorf("fork of snp-two after snp-one's delete sees %q", got)
	}
	if got, _ := sh(t, l2, grand, "cat /workspace/a"); got != "f0\n" {
		t.Errorf("fork of a fork after both sources are gone sees %q", got)
	}
	for _, id := range []string{again, grand} {
		if err := l2.Delete(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if err := l2.DeleteSnapshot(ctxT(t), "snp-two"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{l2.layersDir(), l2.snapshotsDir()} {
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Errorf("%s after every snapshot and sandbox is gone: %v", d, ents)
		}
	}
	// With the providers closed, the disks their pools made ahead go
	// too: nothing is left bound.
	l.Close()
	l2.Close()
	waitNoLoops(t, stateDir)
}

// TestSnapshotUnsupported: without a btrfs disk of its own a sandbox
// cannot be snapshotted, and says why.
func TestSnapshotUnsupported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"ext4", Options{DiskFS: jail.FSExt4}, "btrfs"},
		{"no disk", Options{DefaultDiskGiB: -1}, "no disk limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocal(t, tc.opts)
			id := create(t, l, providers.CreateSpec{})
			_, err := l.Snapshot(ctxT(t), id, "snp-x")
			if !errors.Is(err, providers.ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Snapshot: %v, want ErrUnsupported naming %q", err, tc.want)
			}
			if got, _ := sh(t, l, id, "echo ok > /workspace/f && cat /workspace/f"); got != "ok\n" {
				t.Errorf("sandbox on %s: %q", tc.name, got)
			}
		})
	}
}

// waitNoLoops waits until no loop device is bound to a file under dir
// (a device clears itself once its last mount goes).
func waitNoLoops(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var bound []string
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			b, err := os.ReadFile("/sys/block/" + e.Name() + "/loop/backing_file")
			if err == nil && strings.HasPrefix(string(b), dir) {
				bound = append(bound, e.Name()+": "+strings.TrimSpace(string(b)))
			}
		}
		if len(bound) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("loop devices still bound: %v", bound)
		}
		<-time.After(20 * time.Millisecond)
	}
}
