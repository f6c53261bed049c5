package local

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// BenchmarkCreateVolume: a create of a sandbox with one volume mounted
// read-write and one read-only (sub_path), side by side with a plain one
// (ns/op is both creates and their deletes; the metrics are the creates). The volume's own cost is the id-mapped clones setup makes
// and the binds init makes.
func BenchmarkCreateVolume(b *testing.B) {
	// No disk of the sandbox's own: the create's fixed cost, where the
	// volume's would show.
	l := newLocal(b, Options{DefaultDiskGiB: -1})
	ctx := context.Background()
	vid := "vol-" + providertest.NewID()[4:]
	if err := l.CreateVolume(ctx, vid, 64<<20); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := l.DeleteVolume(context.Background(), vid); err != nil {
			b.Error(err)
		}
	})
	seed := create(b, l, providers.CreateSpec{Volumes: []providers.VolumeMount{{Volume: vid, MountPath: "/data"}}})
	if out, code := sh(b, l, seed, "mkdir -p /data/sub"); code != 0 {
		b.Fatal(out)
	}
	// Interleaved, so that a load that comes and goes weighs on both.
	kinds := [][]providers.VolumeMount{
		nil,
		{{Volume: vid, MountPath: "/data"}, {Volume: vid, MountPath: "/ro", ReadOnly: true, SubPath: "sub"}},
	}
	var took [2]time.Duration
	for b.Loop() {
		for i, volumes := range kinds {
			spec := providers.CreateSpec{ID: providertest.NewID(), Workdir: "/workspace", ReadyTimeout: 30 * time.Second, Volumes: volumes}
			start := time.Now()
			if _, err := l.Create(ctx, spec); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
			if err := l.Delete(ctx, spec.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Milliseconds())/n, "plain-ms/create")
	b.ReportMetric(float64(took[1].Milliseconds())/n, "volume-ms/create")
	b.ReportMetric(float64(took[1])/float64(took[0]), "ratio")
}
