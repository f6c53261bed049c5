package docker

import (
	"context"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

// BenchmarkCreateVolume: a create with one volume mounted read-write and
// one read-only sub_path of it (a staged bind), interleaved with a plain
// create (ns/op is both creates and their deletes; the metrics are the
// creates).
func BenchmarkCreateVolume(b *testing.B) {
	p := newProvider(b, func(o *Options) { o.VolumeDir = b.TempDir() })
	ctx := context.Background()
	vid := "vol-" + providertest.NewID()[4:]
	if err := p.CreateVolume(ctx, vid, 64<<20); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := p.DeleteVolume(context.Background(), vid); err != nil {
			b.Error(err)
		}
	})
	kinds := [][]providers.VolumeMount{
		{{Volume: vid, MountPath: "/data"}},
		nil,
		{{Volume: vid, MountPath: "/data"}, {Volume: vid, MountPath: "/ro", ReadOnly: true, SubPath: "sub"}},
	}
	var took [3]time.Duration
	for n := 0; b.Loop(); n++ {
		for i, volumes := range kinds {
			if i == 0 && n > 0 {
				continue // the first makes /data/sub
			}
			spec := providers.CreateSpec{ID: providertest.NewID(), Image: dockertest.ImageRef, Workdir: "/workspace", ReadyTimeout: time.Minute, Volumes: volumes}
			start := time.Now()
			if _, err := p.Create(ctx, spec); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
			if i == 0 {
				if r, err := p.Exec(ctx, spec.ID, providers.ExecRequest{Command: "mkdir -p /data/sub", Timeout: time.Minute}); err != nil || r.ExitCode != 0 {
					b.Fatal(err, r)
				}
			}
			if err := p.Delete(ctx, spec.ID); err != nil {
				b.Fatal(err)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[1].Milliseconds())/n, "plain-ms/create")
	b.ReportMetric(float64(took[2].Milliseconds())/n, "volume-ms/create")
	b.ReportMetric(float64(took[2])/float64(took[1]), "ratio")
}
