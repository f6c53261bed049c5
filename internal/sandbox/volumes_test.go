package sandbox

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// TestGymVolumes: NeMo Gym's provider_options.volumes (OpenSandbox's
// shape) as Gym sends it, decoded from JSON into any.
func TestGymVolumes(t *testing.T) {
	var bad providers.InvalidFields
	got := gymVolumes([]any{
		map[string]any{"name": "data", "host": map[string]any{"path": "/srv/data"}, "mountPath": "/data", "readOnly": true, "subPath": "train"},
		map[string]any{"name": "work", "pvc": map[string]any{"claimName": "ws"}, "mountPath": "/work"},
		map[string]any{"name": "view", "pvc": map[string]any{"claimName": "ws"}, "mountPath": "/view", "accessMode": "RO"},
	}, &bad)
	want := []VolumeRequest{
		{HostPath: "/srv/data", MountPath: "/data", ReadOnly: true, SubPath: "train"},
		{Volume: "ws", MountPath: "/work"},
		{Volume: "ws", MountPath: "/view", ReadOnly: true},
	}
	if len(bad) != 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v %v, want %+v", got, bad, want)
	}

	bad = nil
	gymVolumes([]any{
		map[string]any{"name": "both", "host": map[string]any{"path": "/a"}, "pvc": map[string]any{"claimName": "b"}, "mountPath": "/x"},
		map[string]any{"name": "none", "mountPath": "/y"},
		map[string]any{"pvc": map[string]any{"claimName": "b"}, "mountPath": "/z", "readOnly": "yes", "accessMode": "RX", "nfs": map[string]any{}},
		"not an object",
	}, &bad)
	fields := map[string]bool{}
	for _, f := range bad {
		fields[f.Field] = true
	}
	for _, f := range []string{"provider_options.volumes[0]", "provider_options.volumes[1]", "provider_options.volumes[2].readOnly",
		"provider_options.volumes[2].accessMode", "provider_options.volumes[2].nfs", "provider_options.volumes[3]"} {
		if !fields[f] {
			t.Errorf("no problem of %s in %v", f, bad)
		}
	}
	bad = nil
	if gymVolumes(map[string]any{}, &bad); len(bad) != 1 {
		t.Errorf("volumes not a list: %v", bad)
	}
}

// TestResolveVolumes: the provider-neutral checks of a create's mounts,
// each problem named by its field.
func TestResolveVolumes(t *testing.T) {
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "in"), 0o755)
	os.Symlink("/etc", filepath.Join(root, "out"))
	os.Symlink("in", filepath.Join(root, "alias"))
	s := &Service{opts: Options{VolumeRoots: []string{root}}}
	s.loadVolumesFrom(nil)
	s.vols.byID["vol-a"] = Volume{ID: "vol-a", Name: "a", Creator: "k1"}
	s.vols.byID["vol-b"] = Volume{ID: "vol-b", Name: "b", Creator: "k2"}

	var bad providers.InvalidFields
	mounts, ids := s.resolveVolumes("k1", []VolumeRequest{
		{Volume: "a", MountPath: "/data/", SubPath: "x/./y"},
		{Volume: "vol-a", MountPath: "/ro", ReadOnly: true},
		{HostPath: filepath.Join(root, "alias"), MountPath: "/host"},
	}, &bad)
	want := []providers.VolumeMount{
		{Volume: "vol-a", MountPath: "/data", SubPath: "x/y"},
		{Volume: "vol-a", MountPath: "/ro", ReadOnly: true},
		{HostPath: filepath.Join(root, "in"), MountPath: "/host"},
	}
	if len(bad) != 0 || !reflect.DeepEqual(mounts, want) || !reflect.DeepEqual(ids, []string{"vol-a"}) {
		t.Fatalf("got %+v %v %v", mounts, ids, bad)
	}

	bad = nil
	s.resolveVolumes("k1", []VolumeRequest{
		{Volume: "b", MountPath: "/b"},                  // another key's
		{Volume: "a", MountPath: "rel"},                 // relative
		{Volume: "a", MountPath: "/"},                   // the root
		{Volume: "a", MountPath: "/sys/x"},              // the kernel's
		{Volume: "a", MountPath: "/m", SubPath: "../x"}, // climbs
		{Volume: "a", MountPath: "/n", SubPath: "/abs"}, // absolute
		{HostPath: filepath.Join(root, "out"), MountPath: "/o"},
		{HostPath: root + "/in/../..", MountPath: "/p"},
		{MountPath: "/q"},
		{Volume: "a", MountPath: "/m"}, // mounted twice
	}, &bad)
	fields := map[string]bool{}
	for _, f := range bad {
		fields[f.Field] = true
	}
	for _, f := range []string{"volumes[0].volume", "volumes[1].mount_path", "volumes[2].mount_path", "volumes[3].mount_path",
		"volumes[4].sub_path", "volumes[5].sub_path", "volumes[6].host_path", "volumes[7].host_path", "volumes[8]", "volumes[9].mount_path"} {
		if !fields[f] {
			t.Errorf("no problem of %s in %v", f, bad)
		}
	}
}
