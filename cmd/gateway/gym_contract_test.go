package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/providers/local"
)

// NeMo Gym's newest sandbox contract, in the JSON its remote provider
// sends: a paused status, pause/resume, a restore that is a create with
// provider_options.snapshot_id and a null image, a delete_snapshot that
// treats "already gone" as success (and, here, is deferred while a
// sandbox made from the snapshot lives), and shm_size at create.

// gymBackend is how a provider's gateway is started and inspected.
type gymBackend struct {
	start func(t *testing.T, state string, args ...string) *proc
	image string // JSON of the create's image: null on local (the host view)
	// stored reports whether snapshot sid's storage is still there: on
	// disk (local) or as an image (docker).
	stored func(t *testing.T, state, sid string) bool
	// vanish deletes sandbox id behind the gateway's back (it is down).
	vanish func(t *testing.T, state, id string)
}

var gymLocal = gymBackend{
	start: func(t *testing.T, state string, args ...string) *proc { return startGateway(t, state, nil, args...) },
	image: "null",
	stored: func(t *testing.T, state, sid string) bool {
		_, err := os.Stat(filepath.Join(state, "local", "snapshots", sid+".json"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return err == nil
	},
	vanish: func(t *testing.T, state, id string) {
		l, err := local.New(local.Options{StateDir: filepath.Join(state, "local")})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.Delete(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	},
}

var gymDocker = gymBackend{
	start: func(t *testing.T, state string, args ...string) *proc { return startDockerGateway(t, state, args...) },
	image: `"` + dockertest.ImageRef + `"`,
	stored: func(t *testing.T, state, sid string) bool {
		_, err := dockertest.Client(t).ImageInspect(context.Background(), "sandgate-snapshot:"+sid)
		if err != nil && !cerrdefs.IsNotFound(err) {
			t.Fatal(err)
		}
		return err == nil
	},
	vanish: func(t *testing.T, state, id string) {
		if err := dockertest.Client(t).ContainerRemove(context.Background(), id, container.RemoveOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
	},
}

func TestGymContractLocal(t *testing.T) {
	t.Parallel()
	gymContract(t, gymLocal)
}

func TestGymContractDocker(t *testing.T) {
	t.Parallel()
	gymContract(t, gymDocker)
}

// gymCreateBody is the create body Gym's RemoteSandboxProvider sends,
// with image (JSON) and provider_options (a JSON object).
func gymCreateBody(image, providerOptions string) string {
	return `{"image": ` + image + `, "ttl_s": 600, "ready_timeout_s": null, "workdir": null, "env": {}, "metadata": {"env": "gym"},
		"resources": {"cpu": null, "memory_mib": null, "disk_gib": null, "gpu": null, "gpu_type": null},
		"entrypoint": null, "provider_options": ` + providerOptions + `}`
}

const gymLease = "X-NeMo-Gym-Sandbox-Lease"

// gymCreate creates a sandbox with Gym's body under API key key.
func gymCreate(t *testing.T, g *proc, key, image, providerOptions string) dkBox {
	t.Helper()
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", gymCreateBody(image, providerOptions), "Authorization", "Bearer "+key)
	var ref struct {
		ID    string `json:"sandbox_id"`
		Token string `json:"lease_token"`
		Scope string `json:"scope"`
	}
	if json.Unmarshal(b, &ref); s != 201 || ref.ID == "" || ref.Scope != "owner" {
		t.Fatalf("create: %d %s\n%s", s, b, g.stderr)
	}
	return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
}

// gymExec runs command with Gym's exec body and lease header; it must
// exit 0. It returns stdout.
func gymExec(t *testing.T, sb dkBox, command string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command, "cwd": nil, "env": nil, "timeout_s": 60, "user": nil})
	s, b := call(t, "POST", sb.url+"/exec", string(body), gymLease, sb.token)
	var r struct {
		Stdout     string `json:"stdout"`
		ReturnCode int    `json:"return_code"`
	}
	if json.Unmarshal(b, &r); s != 200 || r.ReturnCode != 0 {
		t.Fatalf("exec %q: %d %s", command, s, b)
	}
	return r.Stdout
}

// gymStatus is what Gym's status() reads.
func gymStatus(t *testing.T, sb dkBox) string {
	t.Helper()
	s, b := call(t, "GET", sb.url+"/status", "", gymLease, sb.token)
	var st struct{ Status string }
	if json.Unmarshal(b, &st); s != 200 {
		t.Fatalf("status: %d %s", s, b)
	}
	return st.Status
}

func gymContract(t *testing.T, be gymBackend) {
	state := t.TempDir()
	args := []string{"--api-key", "gym-k1,gym-k2"}
	g := be.start(t, state, args...)
	k1, k2 := []string{"Authorization", "Bearer gym-k1"}, []string{"Authorization", "Bearer gym-k2"}
	src := gymCreate(t, g, "gym-k1", be.image, `{}`)
	gymExec(t, src, "echo v1 > seed.txt")

	// Paused: in Gym's status, the sandbox's info and the list's filter.
	if s, b := call(t, "POST", src.url+"/pause", "", gymLease, src.token); s != 200 || !strings.Contains(string(b), `"status":"paused"`) {
		t.Fatalf("pause: %d %s", s, b)
	}
	if st := gymStatus(t, src); st != "paused" {
		t.Fatalf("Gym's status after pause: %q", st)
	}
	if s, b := call(t, "GET", src.url, "", gymLease, src.token); s != 200 || !strings.Contains(string(b), `"status":"paused"`) {
		t.Fatalf("get after pause: %d %s", s, b)
	}
	if s, b := call(t, "GET", g.URL+"/v1/sandboxes?status=paused", "", k1...); s != 200 || !strings.Contains(string(b), src.id) {
		t.Fatalf("list of paused: %d %s", s, b)
	}
	if s, b := call(t, "POST", src.url+"/resume", "", gymLease, src.token); s != 200 || gymStatus(t, src) != "running" {
		t.Fatalf("resume: %d %s", s, b)
	}

	s, b := call(t, "POST", src.url+"/snapshots", `{"name":"gym"}`, gymLease, src.token)
	var snap struct {
		ID string `json:"snapshot_id"`
	}
	if json.Unmarshal(b, &snap); s != 201 || snap.ID == "" {
		t.Fatalf("snapshot: %d %s", s, b)
	}
	snapURL := g.URL + "/v1/snapshots/" + snap.ID
	// Gym's restore: no image, the snapshot in provider_options.
	fork := gymCreate(t, g, "gym-k1", "null", `{"snapshot_id": "`+snap.ID+`"}`)
	if got := gymExec(t, fork, "cat seed.txt"); got != "v1\n" {
		t.Fatalf("the restore reads %q", got)
	}
	// A second restore, which goes while the gateway is down.
	gone := gymCreate(t, g, "gym-k1", "null", `{"snapshot_id": "`+snap.ID+`"}`)

	// Another key: the same answer as for an unknown id, and nothing goes.
	for _, sid := range []string{snap.ID, "snp-nosuchsnapshotzzzzzz"} {
		if s, b := call(t, "DELETE", g.URL+"/v1/snapshots/"+sid, "", k2...); s != 200 || strings.TrimSpace(string(b)) != `{"deleted":false}` {
			t.Fatalf("key 2 deletes %s: %d %s", sid, s, b)
		}
	}
	if s, b := call(t, "GET", snapURL, "", k1...); s != 200 || !be.stored(t, state, snap.ID) {
		t.Fatalf("the snapshot after key 2's delete: %d %s", s, b)
	}

	if n := quotaSnapshots(t, g, k1); n != 1 {
		t.Fatalf("the key's quota counts %d snapshots", n)
	}
	// The owner's delete while the restore lives: done at once, deferred.
	if s, b := call(t, "DELETE", snapURL, "", k1...); s != 200 || strings.TrimSpace(string(b)) != `{"deferred":true,"deleted":true}` {
		t.Fatalf("delete in use: %d %s", s, b)
	}
	if s, b := call(t, "DELETE", snapURL, "", k1...); s != 200 || !strings.Contains(string(b), `"deleted":false`) {
		t.Fatalf("repeated delete: %d %s", s, b)
	}
	assertSnapshotGone := func() {
		t.Helper()
		if s, _ := call(t, "GET", snapURL, "", k1...); s != 404 {
			t.Fatalf("get of the deleted snapshot: %d", s)
		}
		if s, b := call(t, "GET", g.URL+"/v1/snapshots", "", k1...); s != 200 || strings.Contains(string(b), snap.ID) {
			t.Fatalf("list: %d %s", s, b)
		}
		if n := quotaSnapshots(t, g, k1); n != 0 {
			t.Fatalf("the key's quota counts %d snapshots", n)
		}
		if got := gymExec(t, fork, "cat seed.txt; echo more >> seed.txt"); !strings.HasPrefix(got, "v1\n") {
			t.Fatalf("the restore reads %q", got)
		}
		if !be.stored(t, state, snap.ID) {
			t.Fatal("the snapshot's storage went while a sandbox made from it lives")
		}
	}
	assertSnapshotGone()
	if s, b := call(t, "POST", g.URL+"/v1/sandboxes", gymCreateBody("null", `{"snapshot_id": "`+snap.ID+`"}`), k1...); s != 404 {
		t.Fatalf("a create from the deleted snapshot: %d %s", s, b)
	}

	// Across a gateway restart, the second restore gone meanwhile: still
	// deleted, still kept for the first restore, freed with it.
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("the gateway exited cleanly on SIGKILL?")
	}
	be.vanish(t, state, gone.id)
	g = be.start(t, state, args...)
	fork.url = g.URL + "/v1/sandboxes/" + fork.id
	src.url = g.URL + "/v1/sandboxes/" + src.id
	snapURL = g.URL + "/v1/snapshots/" + snap.ID
	assertSnapshotGone()
	if s, b := call(t, "DELETE", fork.url, "", gymLease, fork.token); s != 200 || strings.TrimSpace(string(b)) != `{"deleted":true}` {
		t.Fatalf("delete the restore: %d %s", s, b)
	}
	if be.stored(t, state, snap.ID) {
		t.Fatal("the snapshot's storage outlived the last sandbox made from it")
	}
	if s, b := call(t, "DELETE", snapURL, "", k1...); s != 200 || strings.TrimSpace(string(b)) != `{"deleted":false}` {
		t.Fatalf("delete after the storage went: %d %s", s, b)
	}
	gymExec(t, src, "true") // the source never depended on it
}

// quotaSnapshots is usage.snapshots of GET /v1/quota.
func quotaSnapshots(t *testing.T, g *proc, auth []string) int {
	t.Helper()
	s, b := call(t, "GET", g.URL+"/v1/quota", "", auth...)
	var q struct {
		Usage struct{ Snapshots *int }
	}
	if json.Unmarshal(b, &q); s != 200 || q.Usage.Snapshots == nil {
		t.Fatalf("quota: %d %s", s, b)
	}
	return *q.Usage.Snapshots
}

func TestGymShmSizeLocal(t *testing.T) {
	t.Parallel()
	gymShmSize(t, startGateway(t, t.TempDir(), nil, "--api-key", "gym-k1"), "null")
}

func TestGymShmSizeDocker(t *testing.T) {
	t.Parallel()
	gymShmSize(t, startDockerGateway(t, t.TempDir(), "--api-key", "gym-k1"), `"`+dockertest.ImageRef+`"`)
}

func TestGymShmSizeKubernetes(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	instance, secret := "k8sshm-"+strings.ToLower(rand.Text()[:8]), rand.Text()
	g := startK8sGateway(t, t.TempDir(), instance, secret, "--api-key", "gym-k1")
	gymShmSize(t, g, `"`+k8stest.ImageRef+`"`)

	// Pause: refused, saying why.
	sb := gymCreate(t, g, "gym-k1", `"`+k8stest.ImageRef+`"`, `{}`)
	if s, b := call(t, "POST", sb.url+"/pause", "", gymLease, sb.token); s != 409 || !strings.Contains(string(b), `"code":"not_supported"`) || !strings.Contains(string(b), "cannot freeze") {
		t.Fatalf("pause: %d %s", s, b)
	}
	if st := gymStatus(t, sb); st != "running" {
		t.Fatalf("status after a refused pause: %q", st)
	}
	// No snapshots here: their delete says so rather than "gone".
	if s, b := call(t, "DELETE", g.URL+"/v1/snapshots/snp-nosuchsnapshotzzzzzz", "", "Authorization", "Bearer gym-k1"); s != 409 || !strings.Contains(string(b), "not_supported") {
		t.Fatalf("snapshot delete: %d %s", s, b)
	}
}

// gymShmSize: a bad shm_size is a 400 and makes nothing; a good one, in
// either form, is the size of /dev/shm, and writing past it fails.
func gymShmSize(t *testing.T, g *proc, image string) {
	k1 := []string{"Authorization", "Bearer gym-k1"}
	for _, bad := range []string{`"shm_size": "lots"`, `"shm_size": 1`, `"shm_size": "65g"`, `"shm_size": -1`,
		`"shm_size": "512m", "resources": {"memory_mib": 256}`, `"provider_options": {"shm_size": true}`} {
		s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image": `+image+`, `+bad+`}`, k1...)
		if s != 400 || !strings.Contains(string(b), "shm_size") {
			t.Fatalf("create with %s: %d %s", bad, s, b)
		}
	}
	if s, b := call(t, "GET", g.URL+"/v1/sandboxes", "", k1...); s != 200 || strings.Contains(string(b), "sandbox_id") {
		t.Fatalf("bad creates left sandboxes: %d %s", s, b)
	}

	s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image": `+image+`, "shm_size": "8m"}`, k1...)
	var ref struct {
		ID    string `json:"sandbox_id"`
		Token string `json:"lease_token"`
	}
	if json.Unmarshal(b, &ref); s != 201 {
		t.Fatalf("create: %d %s", s, b)
	}
	sb := dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
	if got := gymExec(t, sb, "df -k /dev/shm | awk 'NR==2 {print $2}'"); got != "8192\n" {
		t.Fatalf("/dev/shm of 8m is %q KiB", got)
	}
	if got := gymExec(t, sb, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=12 2>/dev/null && echo wrote || echo refused; du -k /dev/shm/fill | cut -f1"); !strings.HasPrefix(got, "refused\n") {
		t.Fatalf("writing 12 MiB into an 8 MiB /dev/shm: %q", got)
	}
	if s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image": `+image+`, "shm_size": null, "ttl_s": 60}`, k1...); s != 201 {
		t.Fatalf("create with a null shm_size: %d %s", s, b)
	}
	// Gym's form: in provider_options, in bytes.
	opt := gymCreate(t, g, "gym-k1", image, `{"shm_size": 16777216}`)
	if got := gymExec(t, opt, "df -k /dev/shm | awk 'NR==2 {print $2}'"); got != "16384\n" {
		t.Fatalf("/dev/shm of 16777216 bytes is %q KiB", got)
	}
}
