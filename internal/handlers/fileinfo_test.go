package handlers

import (
	"testing"
)

// TestFileInfoAndList: the info and list routes answer with absolute
// paths, octal modes and types, the entries sorted by name.
func TestFileInfoAndList(t *testing.T) {
	g := newGateway(t, 0)
	a := g.create(map[string]any{"files": map[string]string{"d/b.txt": "bee", "d/a.txt": "a", "d/sub/c": ""}})
	r := g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/files/info?path=d/b.txt", nil, lease(a.Token))
	var fi struct {
		Path, Name, Type, Mode string
		Size                   int64
		Target                 *string `json:"symlink_target"`
	}
	r.json(t, &fi)
	if r.status != 200 || fi.Path != a.Workdir+"/d/b.txt" || fi.Name != "b.txt" || fi.Type != "file" || fi.Size != 3 || fi.Mode != "0644" || fi.Target != nil {
		t.Fatalf("info: %d %s", r.status, r.body)
	}
	r = g.do("GET", "/v1/sandboxes/"+a.SandboxID+"/files/list?path=d", nil, lease(a.Token))
	var list struct {
		Path      string
		Truncated bool
		Entries   []struct{ Path, Name, Type, Mode string }
	}
	r.json(t, &list)
	if r.status != 200 || list.Path != a.Workdir+"/d" || list.Truncated || len(list.Entries) != 3 {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	for i, want := range []string{"a.txt file", "b.txt file", "sub dir"} {
		e := list.Entries[i]
		if e.Name+" "+e.Type != want || e.Path != list.Path+"/"+e.Name {
			t.Errorf("entry %d: %+v, want %s", i, e, want)
		}
	}
	if list.Entries[2].Mode != "0755" {
		t.Errorf("directory mode %q", list.Entries[2].Mode)
	}
}
