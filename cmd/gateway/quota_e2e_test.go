package main

import (
	"encoding/json"
	"testing"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
)

// TestDockerSnapshotQuota: through a real gateway on a real daemon, with
// two API keys and --quota-snapshots 3: snapshot a sandbox then delete
// it, three times; GET /v1/quota shows key A three orphaned snapshots
// with their bytes and key B none; a fourth snapshot is 429
// quota_exceeded and leaves nothing; deleting the snapshots frees it all.
func TestDockerSnapshotQuota(t *testing.T) {
	t.Parallel()
	g := startDockerGateway(t, t.TempDir(), "--api-key", "key-a,key-b", "--quota-snapshots", "3")
	keyA := []string{"Authorization", "Bearer key-a"}
	keyB := []string{"Authorization", "Bearer key-b"}
	create := func() dkBox {
		t.Helper()
		s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image":"`+dockertest.ImageRef+`"}`, keyA...)
		var ref struct {
			ID    string `json:"sandbox_id"`
			Token string `json:"lease_token"`
		}
		if json.Unmarshal(b, &ref); s != 201 {
			t.Fatalf("create: %d %s", s, b)
		}
		return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
	}
	type usage struct {
		Snapshots             int   `json:"snapshots"`
		SnapshotBytes         int64 `json:"snapshot_bytes"`
		OrphanedSnapshots     int   `json:"orphaned_snapshots"`
		OrphanedSnapshotBytes int64 `json:"orphaned_snapshot_bytes"`
	}
	quota := func(key []string) usage {
		t.Helper()
		s, b := call(t, "GET", g.URL+"/v1/quota", "", key...)
		var q struct {
			Usage usage `json:"usage"`
		}
		if json.Unmarshal(b, &q); s != 200 {
			t.Fatalf("GET /v1/quota: %d %s", s, b)
		}
		return q.Usage
	}

	var sids []string
	var total int64
	for range 3 {
		sb := create()
		dkRun(t, sb, "head -c 1000000 /dev/urandom > blob")
		s, b := call(t, "POST", sb.url+"/snapshots", `{}`, "X-Sandbox-Lease", sb.token)
		var sn struct {
			ID   string `json:"snapshot_id"`
			Size int64  `json:"size_bytes"`
		}
		if json.Unmarshal(b, &sn); s != 201 || sn.Size < 1000000 {
			t.Fatalf("snapshot: %d %s", s, b)
		}
		sids, total = append(sids, sn.ID), total+sn.Size
		if s, b := call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token); s != 200 {
			t.Fatalf("delete: %d %s", s, b)
		}
	}
	if q := quota(keyA); q != (usage{3, total, 3, total}) {
		t.Fatalf("key A after three snapshot-then-delete: %+v, want 3 snapshots of %d bytes, all orphaned", q, total)
	}
	if q := quota(keyB); q != (usage{}) {
		t.Fatalf("key B sees key A's snapshots: %+v", q)
	}

	sb := create()
	s, b := call(t, "POST", sb.url+"/snapshots", `{}`, "X-Sandbox-Lease", sb.token)
	var p struct {
		Code string `json:"code"`
	}
	if json.Unmarshal(b, &p); s != 429 || p.Code != "quota_exceeded" {
		t.Fatalf("fourth snapshot: %d %s", s, b)
	}
	if q := quota(keyA); q.Snapshots != 3 {
		t.Fatalf("a refused snapshot was kept: %+v", q)
	}
	for _, sid := range sids {
		if s, b := call(t, "DELETE", g.URL+"/v1/snapshots/"+sid, "", keyA...); s != 200 {
			t.Fatalf("delete snapshot: %d %s", s, b)
		}
	}
	if q := quota(keyA); q != (usage{}) {
		t.Fatalf("after deleting the snapshots: %+v", q)
	}
	if s, b := call(t, "POST", sb.url+"/snapshots", `{}`, "X-Sandbox-Lease", sb.token); s != 201 {
		t.Fatalf("snapshot once the quota is free: %d %s", s, b)
	}
}
