package sandbox

import (
	"context"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// groupProvider is the fake provider with groups: each join gets the next
// address; it records which group each sandbox joined.
type groupProvider struct {
	providers.Provider
	mu     sync.Mutex
	next   netip.Addr
	groups map[string]string // id → group id
	joins  int
}

func (p *groupProvider) JoinGroup(_ context.Context, id, group string) (netip.Addr, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next = p.next.Next()
	p.groups[id] = group
	p.joins++
	return p.next, nil
}

func newGroupEnv(t *testing.T, allow ...string) (*env, *groupProvider) {
	gp := &groupProvider{next: netip.MustParseAddr("100.64.0.1"), groups: map[string]string{}}
	e := newEnv(t, func(o *Options) {
		gp.Provider, o.Provider = o.Provider, gp
		o.APIKeys = []string{"key-a", "key-b"}
		o.AllowAnonymous = false
		o.CapAddAllow = allow
	})
	return e, gp
}

func hostsOf(t *testing.T, p providers.Provider, id string) string {
	t.Helper()
	r, _, err := p.ReadFile(context.Background(), id, "/etc/hosts")
	if err != nil {
		t.Fatalf("read hosts of %s: %v", id, err)
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

func TestGroupUnsupportedProvider(t *testing.T) {
	e := newEnv(t, nil)
	_, err := e.svc.Create(context.Background(), Caller{}, CreateRequest{Group: "web"})
	wantKind(t, err, providers.ErrUnsupported)
	if owned, _ := e.p.List(context.Background()); len(owned) != 0 {
		t.Errorf("a refused create left %d sandboxes", len(owned))
	}
}

// TestGroupMembersAndHosts: members of one key's group share an opaque
// group id (another key's group of that name another) and name each other
// in /etc/hosts; names clash within a group only; a delete and a restart
// rewrite the files.
func TestGroupMembersAndHosts(t *testing.T) {
	e, gp := newGroupEnv(t)
	ctx := context.Background()
	ka, kb := Caller{Bearer: "key-a"}, Caller{Bearer: "key-b"}
	web, err := e.svc.Create(ctx, ka, CreateRequest{Group: "App", Hostname: "web", Aliases: []string{"WWW"}})
	if err != nil {
		t.Fatal(err)
	}
	db, err := e.svc.Create(ctx, ka, CreateRequest{Group: "app", Hostname: "db"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.svc.Create(ctx, kb, CreateRequest{Group: "app", Hostname: "web"})
	if err != nil {
		t.Fatalf("another key's group of the same name: %v", err)
	}
	if gp.groups[web.SandboxID] != gp.groups[db.SandboxID] || gp.groups[web.SandboxID] == gp.groups[other.SandboxID] || strings.Contains(gp.groups[web.SandboxID], "app") {
		t.Fatalf("group ids: %v", gp.groups)
	}
	wi, _ := e.svc.Get(ctx, lease(web.Token), web.SandboxID)
	di, _ := e.svc.Get(ctx, lease(db.Token), db.SandboxID)
	if wi.Group != "app" || wi.Address == "" || strings.Join(wi.Aliases, ",") != "www" {
		t.Fatalf("web's info: %+v", wi.Record)
	}
	if h := hostsOf(t, e.p, web.SandboxID); !strings.Contains(h, di.Address+"\tdb\n") || !strings.Contains(h, wi.Address+"\tweb www\n") {
		t.Errorf("web's hosts:\n%s", h)
	}
	if h := hostsOf(t, e.p, db.SandboxID); !strings.Contains(h, wi.Address+"\twww web\n") {
		t.Errorf("db's hosts:\n%s", h)
	}
	if h := hostsOf(t, e.p, other.SandboxID); strings.Contains(h, "\tdb") || strings.Contains(h, wi.Address+"\t") {
		t.Errorf("another key's member names ours:\n%s", h)
	}

	// A name taken in the group (hostname or alias) is a conflict and
	// nothing is made.
	n, _ := e.p.List(ctx)
	for _, req := range []CreateRequest{{Group: "app", Hostname: "WWW"}, {Group: "app", Aliases: []string{"db"}}} {
		_, err := e.svc.Create(ctx, ka, req)
		wantKind(t, err, providers.ErrConflict)
	}
	if m, _ := e.p.List(ctx); len(m) != len(n) {
		t.Errorf("clashing creates left sandboxes: %d, were %d", len(m), len(n))
	}

	// Hosts: the owner's replace the entries, after the group's names.
	hosts, err := ParseHosts(map[string]any{"API.internal": "10.0.0.7"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.SetHosts(ctx, lease(other.Token), db.SandboxID, hosts); err == nil {
		t.Error("another sandbox's lease set hosts")
	}
	if _, err := e.svc.SetHosts(ctx, lease(db.Token), db.SandboxID, hosts); err != nil {
		t.Fatal(err)
	}
	if h := hostsOf(t, e.p, db.SandboxID); !strings.Contains(h, "10.0.0.7\tapi.internal\n") || !strings.Contains(h, "\twww web\n") {
		t.Errorf("db's hosts after SetHosts:\n%s", h)
	}

	// A restart joins the members again and rewrites the files.
	joins := gp.joins
	e.restart(t)
	if gp.joins != joins+3 {
		t.Errorf("joins after restart: %d, were %d", gp.joins, joins)
	}
	wi, _ = e.svc.Get(ctx, lease(web.Token), web.SandboxID)
	if h := hostsOf(t, e.p, db.SandboxID); !strings.Contains(h, wi.Address+"\twww web\n") || !strings.Contains(h, "api.internal") {
		t.Errorf("db's hosts after restart (web at %s):\n%s", wi.Address, h)
	}

	// A member deleted leaves the others' files.
	if err := e.svc.Delete(ctx, lease(web.Token), web.SandboxID); err != nil {
		t.Fatal(err)
	}
	if h := hostsOf(t, e.p, db.SandboxID); strings.Contains(h, "www") {
		t.Errorf("db's hosts after web's delete:\n%s", h)
	}
}

func TestGroupBadInput(t *testing.T) {
	e, _ := newGroupEnv(t, "NET_ADMIN")
	ctx := context.Background()
	ka := Caller{Bearer: "key-a"}
	for _, c := range []struct {
		req   CreateRequest
		field string
	}{
		{CreateRequest{Group: "a_b"}, "group"},
		{CreateRequest{Group: "g", Hostname: "x."}, "hostname"},
		{CreateRequest{Group: "g", Aliases: []string{"ok", "OK"}}, "aliases[1]"},
		{CreateRequest{Group: "g", Aliases: make([]string, MaxAliases+1)}, "aliases"},
		{CreateRequest{Aliases: []string{"x"}}, "aliases"},
		{CreateRequest{CapAdd: []string{"CAP_NOPE"}}, "cap_add[0]"},
		{CreateRequest{CapAdd: []string{"sys_admin"}}, "cap_add[0]"},
		{CreateRequest{ProviderOptions: map[string]any{"cap_add": []any{"NET_ADMIN", 3}}}, "provider_options.cap_add"},
	} {
		_, err := e.svc.Create(ctx, ka, c.req)
		var bad providers.InvalidFields
		if !asInvalid(err, &bad) || !hasField(bad, c.field) {
			t.Errorf("%+v: %v, want a 400 naming %s", c.req, err, c.field)
		}
	}
	if owned, _ := e.p.List(ctx); len(owned) != 0 {
		t.Errorf("refused creates left %d sandboxes", len(owned))
	}
	ref, err := e.svc.Create(ctx, ka, CreateRequest{CapAdd: []string{"cap_net_admin"}, ProviderOptions: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if i, _ := e.svc.Get(ctx, lease(ref.Token), ref.SandboxID); strings.Join(i.CapAdd, ",") != "NET_ADMIN" || i.Hostname != DefaultHostname || i.Address != "" {
		t.Errorf("info: %+v", i.Record)
	}
	_, err = ParseHosts(map[string]any{"bad name": "10.0.0.1", "ok": "nope", "n": 5.0, "fine": "::1", "FINE": "::2"})
	var bad providers.InvalidFields
	if !asInvalid(err, &bad) || len(bad) != 4 {
		t.Errorf("ParseHosts: %v", err)
	}
}

func asInvalid(err error, out *providers.InvalidFields) bool {
	f, ok := err.(providers.InvalidFields)
	*out = f
	return ok
}

func hasField(f providers.InvalidFields, name string) bool {
	for _, e := range f {
		if e.Field == name {
			return true
		}
	}
	return false
}
