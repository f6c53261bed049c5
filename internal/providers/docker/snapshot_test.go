package docker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// A snapshot is a committed image: sandboxes made from it start with the
// source's files as of the snapshot, each with its own writes; the image
// cannot go while one of them lives, and goes after.
func TestSnapshotAndCreateFrom(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	t.Cleanup(func() { dockertest.RemoveInstance(t, p.instance) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	mk := func(snapshot string) string {
		id := providertest.NewID()
		if _, err := p.Create(ctx, providers.CreateSpec{ID: id, Image: dockertest.ImageRef, Workdir: "/work", Snapshot: snapshot, ReadyTimeout: time.Minute}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	run := func(id, cmd string) string {
		t.Helper()
		res, err := p.Exec(ctx, id, providers.ExecRequest{Command: cmd})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s in %s: %v %+v", cmd, id, err, res)
		}
		return string(res.Stdout)
	}
	src := mk("")
	run(src, "head -c 1000000 /dev/zero > big; echo v1 > a.txt")
	const sid = "snp-dockertestsnapshot1"
	size, err := p.Snapshot(ctx, src, sid)
	if err != nil {
		t.Fatal(err)
	}
	if size < 1000000 {
		t.Errorf("snapshot size %d, want at least the 1 MB written", size)
	}
	run(src, "echo v2 > a.txt")
	// The image list has the test image and never a snapshot image.
	images, err := p.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var hasTest bool
	for _, im := range images {
		hasTest = hasTest || (im.Name == dockertest.ImageRef && im.Source == providers.ImageSourceDocker && im.SizeBytes > 0)
		if strings.HasPrefix(im.Name, "sandgate-snapshot:") {
			t.Errorf("Images lists the snapshot image %s", im.Name)
		}
	}
	if !hasTest {
		t.Errorf("Images lacks %s: %+v", dockertest.ImageRef, images)
	}
	f1, f2 := mk(sid), mk(sid)
	run(f1, "echo f1 > a.txt")
	if got := run(f2, "cat a.txt; pwd"); got != "v1\n/work\n" {
		t.Fatalf("a second sandbox from the snapshot reads %q", got)
	}
	if got := run(f1, "cat a.txt"); got != "f1\n" {
		t.Fatalf("f1 reads %q", got)
	}
	if got := run(src, "cat a.txt"); got != "v2\n" {
		t.Fatalf("the source reads %q", got)
	}
	if err := p.Delete(ctx, src); err != nil {
		t.Fatal(err)
	}
	if got := run(f2, "cat a.txt"); got != "v1\n" {
		t.Fatalf("after the source's delete: %q", got)
	}
	if err := p.DeleteSnapshot(ctx, sid); providers.Kind(err) != providers.ErrConflict {
		t.Fatalf("delete of a snapshot in use: %v, want conflict", err)
	}
	for _, id := range []string{f1, f2} {
		if err := p.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.DeleteSnapshot(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, sid); providers.Kind(err) != providers.ErrNotFound {
		t.Fatalf("second delete: %v, want not found", err)
	}
	if _, err := p.Snapshot(ctx, "sbx-nosuchsandboxxxxxxx", "snp-x"); providers.Kind(err) != providers.ErrNotFound {
		t.Fatalf("snapshot of no sandbox: %v", err)
	}
}
