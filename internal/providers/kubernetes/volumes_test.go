package kubernetes

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/store"
)

// TestVolumes: a volume is a claim of its size, labelled as the
// instance's, that carries the gateway's record of it. The test cluster
// has no provisioner, so the test binds the claim to a hostPath
// PersistentVolume of its own (an operator's static volume): then a writer
// and a read-only reader of a sub_path share it, the reader's writes fail
// with EROFS, a host_path is refused, and a delete removes the claim.
func TestVolumes(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	cs := k8stest.Client(t)
	ctx := ctxT(t, 5*time.Minute)
	id := "vol-" + strings.ToLower(providertest.NewID()[4:])
	if err := p.CreateVolume(ctx, id, 64<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.CoreV1().PersistentVolumeClaims(k8stest.Namespace).Delete(ctxT(t, time.Minute), id, metav1.DeleteOptions{})
	})
	pvc, err := cs.CoreV1().PersistentVolumeClaims(k8stest.Namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; got.Value() != 64<<20 || pvc.Labels[LabelInstance] != p.opts.InstanceID || pvc.Labels[LabelKind] != "volume" ||
		len(pvc.Spec.AccessModes) != 1 || pvc.Spec.AccessModes[0] != corev1.ReadWriteOnce {
		t.Fatalf("the claim: %+v %v", pvc.Spec, pvc.Labels)
	}
	if err := p.CreateVolume(ctx, id, 64<<20); !errors.Is(err, providers.ErrConflict) {
		t.Fatalf("a second create: %v", err)
	}
	vs := p.Store().(store.VolumeStore)
	rec := store.Volume{ID: id, Name: "data", SizeBytes: 64 << 20, Creator: "k", Provider: "kubernetes", CreatedAt: time.Now().UTC().Truncate(time.Second)}
	if err := vs.PutVolume(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if got, err := vs.LoadVolumes(ctx); err != nil || len(got) != 1 || got[0] != rec {
		t.Fatalf("LoadVolumes: %v %+v, want %+v", err, got, rec)
	}

	// The operator's static volume, bound to the claim.
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o777)
	os.Chmod(dir, 0o777)
	pvName := "sandgate-test-" + id
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: k8stest.Namespace, Name: id},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.CoreV1().PersistentVolumes().Delete(ctxT(t, time.Minute), pvName, metav1.DeleteOptions{}) })

	writer := create(t, p, providers.CreateSpec{Volumes: []providers.VolumeMount{{Volume: id, MountPath: "/data"}}})
	reader := create(t, p, providers.CreateSpec{Volumes: []providers.VolumeMount{{Volume: id, MountPath: "/mnt/sub", ReadOnly: true, SubPath: "sub"}}})
	run := func(sb, cmd string) string {
		t.Helper()
		r, err := p.Exec(ctx, sb, providers.ExecRequest{Command: cmd, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("exec %q: %v", cmd, err)
		}
		return string(r.Stdout) + string(r.Stderr)
	}
	run(writer, "echo hello > /data/sub/f")
	if got := run(reader, "cat /mnt/sub/f; touch /mnt/sub/x 2>&1"); !strings.Contains(got, "hello") || !strings.Contains(got, "Read-only file system") {
		t.Fatalf("the reader: %q", got)
	}
	if _, _, err := p.podFor(providers.CreateSpec{ID: "sbx-x", Image: k8stest.ImageRef, Volumes: []providers.VolumeMount{{HostPath: "/srv", MountPath: "/srv"}}}, "/"); !errors.Is(err, providers.ErrInvalid) {
		t.Fatalf("a host_path: %v", err)
	}
	for _, sb := range []string{writer, reader} {
		if err := p.Delete(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.DeleteVolume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteVolume(ctx, id); !errors.Is(err, providers.ErrNotFound) {
		t.Fatalf("a second delete: %v", err)
	}
}
