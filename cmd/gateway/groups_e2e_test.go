package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// Sandbox groups through the gateway's API: names, reachability on any
// port, isolation from other groups and keys, hosts, cap_add, spoofing.

// groupServer answers every TCP connection and UDP datagram on the ports
// of its arguments with its tag (the first argument).
const groupServer = `import socket, sys, threading
tag = sys.argv[1].encode()
def tcp(p):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", p)); s.listen(16)
    while True:
        c, _ = s.accept(); c.sendall(tag); c.close()
def udp(p):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", p))
    while True:
        d, a = u.recvfrom(64); u.sendto(tag, a)
for p in sys.argv[2:]:
    threading.Thread(target=tcp, args=(int(p),), daemon=True).start()
    threading.Thread(target=udp, args=(int(p),), daemon=True).start()
threading.Event().wait()
`

// groupClient connects to host:port over TCP and sends a UDP datagram
// there (from the local address src when given) and prints both answers;
// it exits 0 only when both came.
const groupClient = `import socket, sys
h, p = sys.argv[1], int(sys.argv[2])
src = sys.argv[3] if len(sys.argv) > 3 else ""
a = socket.gethostbyname(h)
c = socket.socket(); c.settimeout(3)
if src: c.bind((src, 0))
c.connect((a, p)); t = c.recv(64).decode(); c.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(0.5)
if src: u.bind((src, 0))
for i in range(6):
    u.sendto(b"?", (a, p))
    try:
        print(t, u.recv(64).decode()); sys.exit(0)
    except socket.timeout:
        pass
print(t, "no-udp"); sys.exit(1)
`

// groupPing sends one ICMP echo to its argument from a raw socket and
// prints pong when the reply comes (no ping binary in every image).
const groupPing = `import socket, struct, sys
a = socket.gethostbyname(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); s.settimeout(3)
def csum(b):
    n = sum(struct.unpack("!%dH" % (len(b) // 2), b)); n = (n >> 16) + (n & 0xffff); n += n >> 16
    return ~n & 0xffff
h = struct.pack("!BBHHH", 8, 0, 0, 0x5347, 1) + b"sandgate"
h = h[:2] + struct.pack("!H", csum(h)) + h[4:]
s.sendto(h, (a, 0))
while True:
    d, src = s.recvfrom(1500)
    if src[0] == a and d[20] == 0:
        print("pong"); break
`

// groupBox creates a sandbox with the group scripts in its workdir and
// the create body's extra members, as key.
func groupBox(t *testing.T, g *proc, key, image, members string) dkBox {
	t.Helper()
	files, _ := json.Marshal(map[string]string{"srv.py": groupServer, "cli.py": groupClient, "ping.py": groupPing})
	return egressKit{}.box(t, g, key, `"image":`+image+`,"files":`+string(files)+","+members)
}

type groupInfo struct {
	Group    *string           `json:"group"`
	Hostname string            `json:"hostname"`
	Aliases  []string          `json:"aliases"`
	Address  *string           `json:"network_address"`
	Hosts    map[string]string `json:"hosts"`
	CapAdd   []string          `json:"cap_add"`
}

func getGroupInfo(t *testing.T, sb dkBox) groupInfo {
	t.Helper()
	s, b := call(t, "GET", sb.url, "", "X-Sandbox-Lease", sb.token)
	var i groupInfo
	if err := json.Unmarshal(b, &i); s != 200 || err != nil {
		t.Fatalf("info: %d %v %s", s, err, b)
	}
	return i
}

// serveGroup starts the test server in sb on ports.
func serveGroup(t *testing.T, sb dkBox, tag string, ports string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, r, err := dkExec(ctx, sb, "setsid python3 srv.py "+tag+" "+ports+" >/dev/null 2>&1 < /dev/null &", true)
	if err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("server %s: %d %v %+v", tag, s, err, r)
	}
}

// talk asserts that sb reaches host:port (TCP and UDP) and hears want,
// polling until the server is up, or with want "", that it never does.
func talk(t *testing.T, sb dkBox, host, port, want string, src ...string) {
	t.Helper()
	cmd := "python3 cli.py " + host + " " + port + " " + strings.Join(src, " ")
	if want == "" {
		if code, out := sh(t, sb, cmd); code == 0 {
			t.Errorf("%s: reached (%q), want nothing", cmd, out)
		}
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out := sh(t, sb, cmd)
		if code == 0 && out == want+" "+want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: exit %d %q, want %q on TCP and UDP", cmd, code, out, want)
			return
		}
	}
}

// testGroups runs the group checks on gateway g (API keys gk-a and gk-b,
// --cap-add-allow NET_ADMIN), whose sandboxes are of image (JSON). restart,
// when not nil, replaces the gateway by a new one on the same state and
// returns it. It leaves no sandbox behind.
func testGroups(t *testing.T, g *proc, image string, restart func() *proc) {
	keyA, keyB := []string{"Authorization", "Bearer gk-a"}, []string{"Authorization", "Bearer gk-b"}
	web := groupBox(t, g, "gk-a", image, `"group":"app","hostname":"web","aliases":["www","frontend"]`)
	db := groupBox(t, g, "gk-a", image, `"group":"app","hostname":"DB"`)
	other := groupBox(t, g, "gk-a", image, `"group":"other","hostname":"solo","cap_add":["NET_ADMIN"]`)
	stranger := groupBox(t, g, "gk-b", image, `"group":"app","hostname":"cache"`)
	boxes := []*dkBox{&web, &db, &other, &stranger}

	wi, di := getGroupInfo(t, web), getGroupInfo(t, db)
	if wi.Group == nil || *wi.Group != "app" || wi.Hostname != "web" || strings.Join(wi.Aliases, ",") != "www,frontend" || wi.Address == nil || di.Address == nil || di.Hostname != "db" {
		t.Fatalf("infos: %+v %+v", wi, di)
	}
	webAddr, dbAddr := *wi.Address, *di.Address
	if _, out := sh(t, web, "hostname"); out != "web" {
		t.Errorf("hostname in web: %q", out)
	}

	serveGroup(t, web, "web", "8123 22")
	serveGroup(t, db, "db", "5432")
	serveGroup(t, stranger, "cache", "6379")
	talk(t, db, "web", "8123", "web")
	talk(t, db, "www", "22", "web")
	talk(t, db, "frontend", "8123", "web")
	talk(t, web, "db", "5432", "db")
	talk(t, web, dbAddr, "5432", "db")
	if code, out := sh(t, db, "python3 ping.py web"); code != 0 || out != "pong" {
		t.Errorf("ICMP echo to web from db: %d %s", code, out)
	}

	// Another group of the key, and a group of the same name of another
	// key, neither resolve nor reach them; nor do the members reach the
	// stranger.
	for _, sb := range []dkBox{other, stranger} {
		if code, out := sh(t, sb, "getent hosts web db www"); code == 0 {
			t.Errorf("%s resolves the group's names: %s", sb.id, out)
		}
		talk(t, sb, webAddr, "8123", "")
		talk(t, sb, dbAddr, "5432", "")
		if code, out := sh(t, sb, "python3 ping.py "+webAddr); code == 0 {
			t.Errorf("%s: ICMP echo to web answered: %s", sb.id, out)
		}
	}
	talk(t, web, *getGroupInfo(t, stranger).Address, "6379", "")

	// The other group's sandbox takes web's address (NET_ADMIN in its own
	// namespace) and speaks as web: it gets nowhere.
	if code, out := sh(t, other, "ip addr add "+webAddr+"/32 dev eth0 && ip addr add "+dbAddr+"/32 dev eth0"); code != 0 {
		t.Fatalf("spoofer's addresses: %d %s", code, out)
	}
	talk(t, other, dbAddr, "5432", "", webAddr)
	talk(t, other, webAddr, "8123", "", dbAddr)

	// Hosts: Gym's set_hosts body lands in /etc/hosts and is used; bad
	// entries are one 400 and change nothing; another key cannot.
	s, b := call(t, "PUT", db.url+"/hosts", `{"api.internal": "`+webAddr+`", "Mirror": "2001:db8::1"}`, gymLease, db.token)
	if s != 200 || !strings.Contains(string(b), `"api.internal":"`+webAddr+`"`) {
		t.Fatalf("PUT hosts: %d %s", s, b)
	}
	if _, out := sh(t, db, "cat /etc/hosts"); !strings.Contains(out, webAddr+"\tapi.internal") || !strings.Contains(out, "2001:db8::1\tmirror") || !strings.Contains(out, webAddr+"\twww frontend web") {
		t.Errorf("db's /etc/hosts:\n%s", out)
	}
	talk(t, db, "api.internal", "8123", "web")
	for _, bad := range []struct{ body, want string }{
		{`{"bad name!": "10.0.0.1", "ok": "not-an-ip", "n": 5, "fine": "10.0.0.2"}`, `"hosts.bad name!"`},
		{`["a"]`, "body"},
		{`{"x": null}`, `"hosts.x"`},
	} {
		s, b := call(t, "PUT", db.url+"/hosts", bad.body, gymLease, db.token)
		// A body that is no object fails the schema: 422, as elsewhere.
		if (s != 400 && s != 422) || !strings.Contains(string(b), bad.want) {
			t.Errorf("PUT hosts %s: %d %s", bad.body, s, b)
		}
	}
	if s, b := call(t, "PUT", db.url+"/hosts", `{"evil": "10.9.9.9"}`, keyB...); s != 403 && s != 404 {
		t.Errorf("PUT hosts by another key: %d %s", s, b)
	}
	if i := getGroupInfo(t, db); len(i.Hosts) != 2 || i.Hosts["api.internal"] != webAddr {
		t.Errorf("hosts after refused PUTs: %v", i.Hosts)
	}
	if _, out := sh(t, db, "cat /etc/hosts"); strings.Contains(out, "10.0.0.2") || strings.Contains(out, "evil") {
		t.Errorf("a refused PUT reached /etc/hosts:\n%s", out)
	}

	// Bad creates: 400 (or 409 for a name taken in the group) and nothing
	// is made.
	for _, bad := range []struct {
		body  string
		code  int
		field string
	}{
		{`"group":"Bad_Group"`, 400, `"group"`},
		{`"group":"g","hostname":"-x"`, 400, `"hostname"`},
		{`"group":"g","aliases":["a b"]`, 400, `"aliases[0]"`},
		{`"aliases":["lonely"]`, 400, `"aliases"`},
		{`"cap_add":["NOPE"]`, 400, `"cap_add[0]"`},
		{`"cap_add":["CAP_SYS_ADMIN"]`, 400, "--cap-add-allow"},
		{`"provider_options":{"cap_add":"NET_ADMIN"}`, 400, `"provider_options.cap_add"`},
		{`"group":"app","hostname":"web"`, 409, "web"},
		{`"group":"app","aliases":["db"]`, 409, "db"},
	} {
		s, b := call(t, "POST", g.URL+"/v1/sandboxes", `{"image":`+image+`,`+bad.body+`}`, keyA...)
		if s != bad.code || !strings.Contains(string(b), bad.field) {
			t.Errorf("create %s: %d %s", bad.body, s, b)
		}
	}
	if s, b := call(t, "GET", g.URL+"/v1/sandboxes", "", keyA...); s != 200 || strings.Count(string(b), `"sandbox_id"`) != 3 {
		t.Errorf("list after refused creates: %d %s", s, b)
	}

	// cap_add: NET_ADMIN (Gym's provider_options form, CAP_ prefix) lets
	// root inside add a link to its own namespace; without it, it cannot.
	capped := groupBox(t, g, "gk-a", image, `"provider_options":{"cap_add":["CAP_NET_ADMIN"]}`)
	plain := groupBox(t, g, "gk-a", image, `"metadata":{}`)
	if code, out := sh(t, capped, "ip link add sgx0 type veth peer name sgx1 && ip link show sgx0"); code != 0 {
		t.Errorf("with NET_ADMIN: %d %s", code, out)
	}
	if code, out := sh(t, plain, "ip link add sgx0 type veth peer name sgx1"); code == 0 {
		t.Errorf("without NET_ADMIN: link added: %s", out)
	}
	if i := getGroupInfo(t, capped); strings.Join(i.CapAdd, ",") != "NET_ADMIN" || i.Address != nil || i.Group != nil || i.Hostname != "sandbox" {
		t.Errorf("capped's info: %+v", i)
	}
	boxes = append(boxes, &capped, &plain)

	// /etc/hosts is written inside the sandbox: a symlink there to a path
	// of the host lands in the sandbox's own file of that name.
	hostFile := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hostFile, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out := sh(t, stranger, "mkdir -p "+filepath.Dir(hostFile)+" && ln -sf "+hostFile+" /etc/hosts"); code != 0 {
		t.Fatalf("symlink: %d %s", code, out)
	}
	if s, b := call(t, "PUT", stranger.url+"/hosts", `{"x.test": "10.1.1.1"}`, "X-Sandbox-Lease", stranger.token); s != 200 {
		t.Errorf("PUT hosts through a symlink: %d %s", s, b)
	}
	if got, err := os.ReadFile(hostFile); err != nil || string(got) != "host\n" {
		t.Errorf("the host's file: %q %v", got, err)
	}

	if restart != nil {
		g = restart()
		for _, b := range boxes {
			b.url = g.URL + "/v1/sandboxes/" + b.id
		}
		if i := getGroupInfo(t, web); i.Address == nil {
			t.Fatalf("web after restart: %+v", i)
		} else {
			webAddr = *i.Address
		}
		talk(t, db, "web", "8123", "web")
		talk(t, web, "db", "5432", "db")
		talk(t, other, webAddr, "8123", "")
	}

	// A member deleted leaves the others' /etc/hosts.
	if s, b := call(t, "DELETE", db.url, "", "X-Sandbox-Lease", db.token); s != 200 && s != 204 {
		t.Fatalf("delete db: %d %s", s, b)
	}
	if _, out := sh(t, web, "cat /etc/hosts"); strings.Contains(out, "\tdb") {
		t.Errorf("web's /etc/hosts still names db:\n%s", out)
	}
	if code, out := sh(t, web, "getent hosts db"); code == 0 {
		t.Errorf("web resolves db after its delete: %s", out)
	}
	for _, b := range boxes {
		if b.id == db.id {
			continue
		}
		if s, body := call(t, "DELETE", b.url, "", "X-Sandbox-Lease", b.token); s != 204 && s != 200 {
			t.Errorf("delete %s: %d %s", b.id, s, body)
		}
	}
}

// TestGroupsLocal: testGroups on local sandboxes (the host's view), with
// a gateway restart; the host's links are the same after.
func TestGroupsLocal(t *testing.T) {
	t.Parallel()
	before := egresstest.Links(t)
	dir := t.TempDir()
	args := []string{"--api-key", "gk-a,gk-b", "--cap-add-allow", "NET_ADMIN"}
	g := startGateway(t, dir, nil, args...)
	testGroups(t, g, "null", func() *proc {
		if err := g.stop(syscall.SIGKILL); err == nil {
			t.Fatal("gateway survived SIGKILL")
		}
		g = startGateway(t, dir, nil, args...)
		return g
	})
	g.stop(syscall.SIGTERM)
	if added := egresstest.NewLinks(before, egresstest.Links(t)); len(added) > 0 {
		t.Errorf("links added to the host: %v", added)
	}
}

// TestGroupsDocker: groups on docker sandboxes (busybox, so nc and
// /etc/hosts rather than testGroups' python): members reach each other
// by hostname and alias on any port, a sandbox of another group or of
// another key's group of the same name reaches neither and cannot
// resolve them, a member deleted leaves the others' /etc/hosts, and
// membership survives a gateway restart.
func TestGroupsDocker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := []string{"--api-key", "gk-a,gk-b"}
	g := startDockerGateway(t, dir, args...)
	image := `"` + dockertest.ImageRef + `"`
	box := func(key, members string) dkBox {
		return egressKit{}.box(t, g, key, `"image":`+image+`,`+members)
	}
	web := box("gk-a", `"group":"g","hostname":"web","aliases":["api"]`)
	cli := box("gk-a", `"group":"g","hostname":"cli"`)
	other := box("gk-a", `"group":"h","hostname":"spy"`)
	stranger := box("gk-b", `"group":"g","hostname":"twin"`)
	if i := getGroupInfo(t, web); i.Address == nil || i.Hostname != "web" {
		t.Fatalf("web: %+v", i)
	}
	if code, out := sh(t, web, "hostname"); code != 0 || out != "web" {
		t.Fatalf("hostname: %d %q", code, out)
	}
	serve := func(sb dkBox, port string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, r, err := dkExec(ctx, sb, "setsid nc -ll -p "+port+" -e hostname >/dev/null 2>&1 </dev/null &", true)
		if err != nil || s != 200 || r.ReturnCode != 0 {
			t.Fatalf("serve %s: %d %v %+v", port, s, err, r)
		}
	}
	serve(web, "8080")
	serve(web, "31337")
	reachName := func(sb dkBox, host, port string) {
		t.Helper()
		testkit.EventuallyNil(t, "nc "+host+" "+port, 30*time.Second, func() error {
			if code, out := sh(t, sb, "nc -w 2 "+host+" "+port+" </dev/null"); code != 0 || out != "web" {
				return fmt.Errorf("exit %d %q", code, out)
			}
			return nil
		})
	}
	reachName(cli, "web", "8080")
	reachName(cli, "api", "31337")
	webAddr := *getGroupInfo(t, web).Address
	for _, sb := range []dkBox{other, stranger} {
		// (The egress point may take the connection and close it: what
		// matters is that no answer of web's comes.)
		if _, out := sh(t, sb, "nc -w 2 "+webAddr+" 8080 </dev/null"); out != "" {
			t.Errorf("a non-member reached web at %s: %q", webAddr, out)
		}
		if code, _ := sh(t, sb, "ping -c 1 -W 1 web"); code == 0 {
			t.Error("a non-member resolved and reached web by name")
		}
	}

	// A restart re-plumbs every member; the names still work.
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("gateway survived SIGKILL")
	}
	g = startDockerGateway(t, dir, args...)
	for _, sb := range []*dkBox{&web, &cli, &other, &stranger} {
		sb.url = g.URL + "/v1/sandboxes/" + sb.id
	}
	reachName(cli, "web", "8080")

	// Deleting a member takes it out of the others' /etc/hosts.
	if s, b := call(t, "DELETE", web.url, "", "X-Sandbox-Lease", web.token); s != 200 {
		t.Fatalf("delete web: %d %s", s, b)
	}
	testkit.EventuallyNil(t, "web gone from cli's /etc/hosts", 30*time.Second, func() error {
		if _, out := sh(t, cli, "cat /etc/hosts"); strings.Contains(out, "web") {
			return fmt.Errorf("%s", out)
		}
		return nil
	})
	for _, sb := range []dkBox{cli, other, stranger} {
		call(t, "DELETE", sb.url, "", "X-Sandbox-Lease", sb.token)
	}
}
