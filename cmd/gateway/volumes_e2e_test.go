package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// volumeKeys are the two API keys of the volume tests: volumes are k1's,
// k2 is the stranger.
const volumeKeys = "vk1,vk2"

func asKey(k string) []string { return []string{"Authorization", "Bearer " + k} }

// removeVolumesAfter removes (unmounts) every local volume left in
// stateDir when the test ends, after the gateway and its sandboxes are
// gone: call it before starting the gateway, so that its cleanup runs
// last. A volume is a host mount: it must not outlive the test.
func removeVolumesAfter(t *testing.T, volumesDir string) {
	t.Cleanup(func() {
		ents, _ := os.ReadDir(volumesDir)
		for _, e := range ents {
			if err := jail.RemoveVolume(filepath.Join(volumesDir, e.Name())); err != nil {
				t.Errorf("remove volume %s: %v", e.Name(), err)
			}
		}
	})
}

// TestLocalVolumes: on the local provider through a real gateway, one
// volume, one writer and two read-only readers (one of a sub_path): the
// readers see the writer's files, owned by their own root although each
// sandbox has its own id range, and their writes fail with EROFS; a write
// past the volume's size fails with ENOSPC; host_path outside the roots,
// sub_path with ".." or through a symlink the writer planted are 400 (all
// problems in one answer); another key cannot see, mount or delete it; a
// mounted volume's delete is 409, also after a gateway restart; once its
// sandboxes are gone it is deleted and its storage with it.
func TestLocalVolumes(t *testing.T) {
	t.Parallel()
	volumes(t, "local", func(state string, args ...string) *proc { return startGateway(t, state, nil, args...) }, "")
}

// TestDockerVolumes is TestLocalVolumes on the docker provider: the
// volume is a docker volume bound to the same kind of filesystem, the
// sub_path and host_path mounts binds of staged mounts.
func TestDockerVolumes(t *testing.T) {
	t.Parallel()
	volumes(t, "docker-volumes", func(state string, args ...string) *proc { return startDockerGateway(t, state, args...) },
		`"image":"`+dockertest.ImageRef+`",`)
}

// volumes runs the volume scenario on a gateway start makes, whose
// provider keeps its volumes in subdir of the state dir; image is the
// create's image member (with its comma), if the provider needs one.
func volumes(t *testing.T, subdir string, startIn func(state string, args ...string) *proc, image string) {
	state, root := t.TempDir(), t.TempDir()
	volumesDir := filepath.Join(state, subdir)
	if subdir == "local" {
		volumesDir = filepath.Join(state, "local", "volumes")
	}
	removeVolumesAfter(t, volumesDir)
	start := func() *proc {
		return startIn(state, "--api-key", volumeKeys, "--volume-root", root, "--quota-disk-gib", "100")
	}
	g := start()
	k1, k2 := asKey("vk1"), asKey("vk2")
	os.MkdirAll(filepath.Join(root, "shared"), 0o755)
	os.WriteFile(filepath.Join(root, "shared", "host.txt"), []byte("from the host\n"), 0o644)
	os.Symlink("/etc", filepath.Join(root, "out"))

	s, body := call(t, "POST", g.URL+"/v1/volumes", `{"name":"data","size_gib":0.0625}`, k1...)
	var vol struct {
		ID        string   `json:"volume_id"`
		Name      string   `json:"name"`
		SizeGiB   float64  `json:"size_gib"`
		MountedBy []string `json:"mounted_by"`
	}
	if json.Unmarshal(body, &vol); s != 201 || !strings.HasPrefix(vol.ID, "vol-") || vol.SizeGiB != 0.0625 {
		t.Fatalf("create volume: %d %s", s, body)
	}
	if s, body := call(t, "POST", g.URL+"/v1/volumes", `{"name":"data","size_gib":1}`, k1...); s != 409 {
		t.Fatalf("a second volume of the name: %d %s", s, body)
	}
	if s, body := call(t, "POST", g.URL+"/v1/volumes", `{"name":"huge","size_gib":100}`, k1...); s != 429 || !strings.Contains(string(body), "quota_exceeded") {
		t.Fatalf("a volume over the disk quota: %d %s", s, body)
	}
	if s, body := call(t, "GET", g.URL+"/v1/quota", "", k1...); s != 200 || !strings.Contains(string(body), `"volumes":1}`) || !strings.Contains(string(body), `"volume_gib":0.0625`) {
		t.Fatalf("the quota: %d %s", s, body)
	}
	create := func(key []string, members string) (int, []byte) {
		return call(t, "POST", g.URL+"/v1/sandboxes", "{"+image+members+"}", key...)
	}
	made := func(members string) dkBox {
		t.Helper()
		s, b := create(k1, members)
		var ref struct {
			ID    string `json:"sandbox_id"`
			Token string `json:"lease_token"`
		}
		if json.Unmarshal(b, &ref); s != 201 {
			t.Fatalf("create with %s: %d %s\n%s", members, s, b, g.stderr)
		}
		return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
	}
	writer := made(`"volumes":[{"volume":"data","mount_path":"/data"},{"host_path":"` + root + `/shared","mount_path":"/host","read_only":true}]`)
	dkRun(t, writer, "echo hello > /data/f && mkdir /data/sub && echo deep > /data/sub/g && ln -s / /data/evil && ln -s ../../.. /data/sub/up")
	if got := dkRun(t, writer, "cat /host/host.txt; touch /host/x 2>&1 || true"); !strings.Contains(got, "from the host") || !strings.Contains(got, "Read-only file system") {
		t.Fatalf("the read-only host path: %q", got)
	}
	// Gym's shape: the volume as a pvc's claim, read-only by accessMode.
	r1 := made(`"provider_options":{"volumes":[{"name":"d","pvc":{"claimName":"data"},"mountPath":"/data","accessMode":"RO"}]}`)
	r2 := made(`"volumes":[{"volume":"` + vol.ID + `","mount_path":"/mnt/deep","read_only":true,"sub_path":"sub"}]`)

	if got := dkRun(t, r1, "cat /data/f /data/sub/g; stat -c %u:%g /data/f"); got != "hello\ndeep\n0:0\n" {
		t.Fatalf("reader 1 sees %q", got)
	}
	if got := dkRun(t, r2, "cat /mnt/deep/g; ls /mnt/deep"); got != "deep\ng\nup\n" {
		t.Fatalf("reader 2 (sub_path) sees %q", got)
	}
	for _, r := range []struct {
		sb   dkBox
		file string
	}{{r1, "/data/f"}, {r2, "/mnt/deep/g"}} {
		// The errno from inside: an append, a create; a remount is refused.
		dir := filepath.Dir(r.file)
		got := dkRun(t, r.sb, "(echo x >> "+r.file+") 2>&1; touch "+dir+"/new 2>&1; mount -o remount,rw "+dir+" 2>&1 && echo remounted; true")
		if strings.Count(got, "Read-only file system") != 2 || strings.Contains(got, "remounted") {
			t.Fatalf("a reader's writes in %s: %q", dir, got)
		}
		if got := dkRun(t, r.sb, "test -e "+dir+"/new && echo made || echo none"); got != "none\n" {
			t.Fatalf("a reader's write landed: %q", got)
		}
	}
	// The writer's later writes are seen at once, and the volume is
	// writable by the writer as root of its own range.
	dkRun(t, writer, "echo again >> /data/f")
	if got := dkRun(t, r1, "cat /data/f"); got != "hello\nagain\n" {
		t.Fatalf("reader 1 after the append: %q", got)
	}
	if got := dkRun(t, writer, "dd if=/dev/zero of=/data/big bs=1M count=200 2>&1; echo rc=$?"); !strings.Contains(got, "No space left on device") || strings.Contains(got, "rc=0") {
		t.Fatalf("a write past the size: %q", got)
	}
	dkRun(t, writer, "rm /data/big")

	// Bad mounts: every problem in one 400, nothing made.
	s, body = create(k1, `"volumes":[`+
		`{"host_path":"/etc","mount_path":"/a"},`+
		`{"host_path":"`+root+`/out","mount_path":"/b"},`+
		`{"host_path":"`+root+`/shared/../../","mount_path":"/c"},`+
		`{"volume":"data","mount_path":"/d","sub_path":"../x"},`+
		`{"volume":"data","mount_path":"/proc/x"},`+
		`{"volume":"nope","mount_path":"/e"},`+
		`{"volume":"data","host_path":"`+root+`","mount_path":"/f"}],"workdir":"rel"`)
	var prob struct {
		Errors []struct{ Field, Message string } `json:"errors"`
	}
	json.Unmarshal(body, &prob)
	fields := map[string]bool{}
	for _, e := range prob.Errors {
		fields[e.Field] = true
	}
	for _, f := range []string{"volumes[0].host_path", "volumes[1].host_path", "volumes[2].host_path", "volumes[3].sub_path", "volumes[4].mount_path", "volumes[5].volume", "volumes[6]", "workdir"} {
		if s != 400 || !fields[f] {
			t.Fatalf("bad mounts: %d %s (want a problem of %s)", s, body, f)
		}
	}
	// The writer's planted symlinks: one absolute, one climbing out.
	for _, sub := range []string{"evil", "sub/up", "evil/etc"} {
		if s, body := create(k1, `"volumes":[{"volume":"data","mount_path":"/x","sub_path":"`+sub+`"}]`); s != 400 || !strings.Contains(string(body), "sub_path") {
			t.Fatalf("sub_path %s through a planted symlink: %d %s", sub, s, body)
		}
	}

	// Another key: not found, not mountable, not deletable.
	if s, _ := call(t, "GET", g.URL+"/v1/volumes/data", "", k2...); s != 404 {
		t.Fatalf("another key's get: %d", s)
	}
	if s, body := call(t, "GET", g.URL+"/v1/volumes", "", k2...); s != 200 || strings.Contains(string(body), vol.ID) {
		t.Fatalf("another key's list: %d %s", s, body)
	}
	if s, body := create(k2, `"volumes":[{"volume":"`+vol.ID+`","mount_path":"/data"}]`); s != 400 {
		t.Fatalf("another key mounts it: %d %s", s, body)
	}
	if s, _ := call(t, "DELETE", g.URL+"/v1/volumes/"+vol.ID, "", k2...); s != 404 {
		t.Fatalf("another key's delete: %d", s)
	}

	// In use: 409, also after a restart, which keeps it and its files.
	if s, body := call(t, "DELETE", g.URL+"/v1/volumes/data", "", k1...); s != 409 {
		t.Fatalf("delete while mounted: %d %s", s, body)
	}
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	// As after a reboot, the host's mount of the volume is gone (the
	// sandboxes hold their own): the gateway mounts it again at start,
	// the same filesystem.
	mnt := filepath.Join(volumesDir, vol.ID, jail.VolumeMnt)
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if jail.VolumeMounted(filepath.Join(volumesDir, vol.ID)) {
		t.Fatal("still mounted")
	}
	g = start()
	if !jail.VolumeMounted(filepath.Join(volumesDir, vol.ID)) {
		t.Fatal("the restarted gateway did not mount the volume")
	}
	writer.url, r1.url, r2.url = g.URL+"/v1/sandboxes/"+writer.id, g.URL+"/v1/sandboxes/"+r1.id, g.URL+"/v1/sandboxes/"+r2.id
	s, body = call(t, "GET", g.URL+"/v1/volumes/data", "", k1...)
	if json.Unmarshal(body, &vol); s != 200 || len(vol.MountedBy) != 3 {
		t.Fatalf("after the restart: %d %s", s, body)
	}
	dkRun(t, writer, "echo after >> /data/f")
	if got := dkRun(t, r1, "cat /data/f"); got != "hello\nagain\nafter\n" {
		t.Fatalf("reader 1 after the restart: %q", got)
	}
	if got, err := os.ReadFile(filepath.Join(mnt, "f")); err != nil || string(got) != "hello\nagain\nafter\n" {
		t.Fatalf("the remounted volume holds %q (%v): not the sandboxes' filesystem", got, err)
	}
	// The Go client, as the key.
	c, err := client.New(g.URL, "vk1", nil)
	if err != nil {
		t.Fatal(err)
	}
	var cerr *client.Error
	if err := c.DeleteVolume(context.Background(), "data"); !errors.As(err, &cerr) || cerr.Status != 409 {
		t.Fatalf("delete while mounted, after the restart: %v", err)
	}
	if v, err := c.CreateVolume(context.Background(), api.CreateVolume{Name: "scratch", SizeGib: 0.0625}); err != nil || v.Name != "scratch" {
		t.Fatalf("the client's create: %+v %v", v, err)
	}
	if vs, err := c.Volumes(context.Background()); err != nil || len(vs) != 2 || vs[0].Name != "data" || vs[1].Name != "scratch" {
		t.Fatalf("the client's list: %+v %v", vs, err)
	}
	if err := c.DeleteVolume(context.Background(), "scratch"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Volume(context.Background(), "scratch"); !errors.As(err, &cerr) || cerr.Status != 404 {
		t.Fatalf("the deleted volume, by the client: %v", err)
	}
	for _, sb := range []dkBox{writer, r1, r2} {
		if s, body := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
			t.Fatalf("delete %s: %d %s", sb.id, s, body)
		}
	}
	if s, body := call(t, "DELETE", g.URL+"/v1/volumes/data", "", k1...); s != 200 {
		t.Fatalf("delete: %d %s", s, body)
	}
	if s, _ := call(t, "GET", g.URL+"/v1/volumes/"+vol.ID, "", k1...); s != 404 {
		t.Fatalf("the deleted volume: %d", s)
	}
	if _, err := os.Stat(filepath.Join(volumesDir, vol.ID)); !os.IsNotExist(err) {
		t.Fatalf("the deleted volume's storage: %v", err)
	}
	if mounts, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mounts), vol.ID) {
		t.Fatal("the deleted volume is still mounted")
	}
}

// TestKubernetesVolumes: on the kubernetes provider through a real
// gateway, a volume is a claim of its size whose record (an annotation
// of it) survives a gateway restart, a host_path is refused with 400, a
// create that mounts it fails naming the unbound claim (the test cluster
// has no provisioner: the pod cannot be scheduled), and a delete removes
// the claim.
func TestKubernetesVolumes(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	instance, secret := "k8svol-"+strings.ToLower(rand.Text()[:8]), rand.Text()
	state := t.TempDir()
	g := startK8sGateway(t, state, instance, secret, "--volume-root", t.TempDir())
	s, body := call(t, "POST", g.URL+"/v1/volumes", `{"name":"data","size_gib":0.5}`)
	var vol struct {
		ID string `json:"volume_id"`
	}
	if json.Unmarshal(body, &vol); s != 201 {
		t.Fatalf("create volume: %d %s", s, body)
	}
	pvcs := k8stest.Client(t).CoreV1().PersistentVolumeClaims(k8stest.Namespace)
	t.Cleanup(func() { pvcs.Delete(context.Background(), vol.ID, metav1.DeleteOptions{}) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pvc, err := pvcs.Get(ctx, vol.ID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; q.Value() != 512<<20 || !strings.Contains(pvc.Annotations["sandgate.volume"], `"name":"data"`) {
		t.Fatalf("the claim: %v %v", pvc.Spec.Resources, pvc.Annotations)
	}
	if s, body := call(t, "POST", g.URL+"/v1/sandboxes", `{"image":"`+k8stest.ImageRef+`","volumes":[{"host_path":"/srv","mount_path":"/srv"}]}`); s != 400 {
		t.Fatalf("a host_path on kubernetes: %d %s", s, body)
	}

	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	g = startK8sGateway(t, state, instance, secret)
	if s, body := call(t, "GET", g.URL+"/v1/volumes/data", ""); s != 200 || !strings.Contains(string(body), vol.ID) {
		t.Fatalf("after the restart: %d %s", s, body)
	}
	// Unbound, the claim keeps the sandbox from being scheduled.
	if s, body := call(t, "POST", g.URL+"/v1/sandboxes", `{"image":"`+k8stest.ImageRef+`","ready_timeout_s":3,"volumes":[{"volume":"data","mount_path":"/data"}]}`); s/100 != 5 || !strings.Contains(string(body), vol.ID) {
		t.Fatalf("a create on an unbound claim: %d %s", s, body)
	}
	if s, body := call(t, "DELETE", g.URL+"/v1/volumes/data", ""); s != 200 {
		t.Fatalf("delete: %d %s", s, body)
	}
	if pvc, err := pvcs.Get(ctx, vol.ID, metav1.GetOptions{}); err == nil && pvc.DeletionTimestamp == nil {
		t.Fatal("the claim outlived its volume")
	}
	if s, _ := call(t, "GET", g.URL+"/v1/volumes/data", ""); s != 404 {
		t.Fatalf("the deleted volume: %d", s)
	}
}
