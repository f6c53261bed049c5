package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// egressKit is what differs between providers in the egress test: how the
// gateway starts, what a create carries, and the commands a sandbox runs.
type egressKit struct {
	start  func(t *testing.T, dir string, args ...string) *proc
	create string // members every create carries ("" or `"image":...`)
	// who is a command that sends GET /who to addr naming host (Host on
	// HTTP, SNI on HTTPS); its output holds the answer if it got through.
	who func(tls bool, addr, host string) string
	// lookup is a command that succeeds if and only if name resolves.
	lookup func(name string) string
	// tls: the sandbox's client completes a handshake with the test
	// internet (busybox's does not: its TLS 1.2 has no
	// signature_algorithms, which Go's server requires).
	tls bool
	// netAdmin: root in a sandbox holds CAP_NET_ADMIN and CAP_NET_RAW
	// (local: in its own user namespace); a docker sandbox holds neither
	// (dropped or never granted), which the test checks instead.
	netAdmin bool
}

var localEgress = egressKit{
	start: func(t *testing.T, dir string, args ...string) *proc { return startGateway(t, dir, nil, args...) },
	who: func(tls bool, addr, host string) string {
		scheme, port := "http", "80"
		if tls {
			scheme, port = "https", "443"
		}
		if addr == host {
			return "curl -sSk -m 5 " + scheme + "://" + host + "/who"
		}
		return "curl -sSk -m 3 --resolve " + host + ":" + port + ":" + addr + " " + scheme + "://" + host + "/who"
	},
	lookup:   func(name string) string { return "getent hosts " + name },
	tls:      true,
	netAdmin: true,
}

var dockerEgress = egressKit{
	start:    startDockerGateway,
	create:   `"image":"` + dockertest.ImageRef + `"`,
	who:      egresstest.BusyboxWho,
	lookup:   func(name string) string { return "nslookup " + name + " | grep -q '^Name:'" },
	tls:      false,
	netAdmin: false,
}

// box creates a sandbox with the kit's and the create body's extra
// members, as key.
func (k egressKit) box(t *testing.T, g *proc, key, members string) dkBox {
	t.Helper()
	body := `{"ttl_s":600`
	if k.create != "" {
		body += "," + k.create
	}
	if members != "" {
		body += "," + members
	}
	s, b := call(t, "POST", g.URL+"/v1/sandboxes", body+"}", "Authorization", "Bearer "+key)
	if s != 201 {
		t.Fatalf("create %s: %d %s\n%s", members, s, b, g.stderr)
	}
	var ref struct {
		ID    string `json:"sandbox_id"`
		Token string `json:"lease_token"`
	}
	if err := json.Unmarshal(b, &ref); err != nil || ref.ID == "" {
		t.Fatalf("create: %v %s", err, b)
	}
	return dkBox{url: g.URL + "/v1/sandboxes/" + ref.ID, id: ref.ID, token: ref.Token}
}

// sh runs command in sb as root and returns its exit code and output.
func sh(t *testing.T, sb dkBox, command string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, r, err := dkExec(ctx, sb, command, false)
	if err != nil || s != 200 {
		t.Fatalf("exec %q: %d %v", command, s, err)
	}
	return r.ReturnCode, strings.TrimSpace(r.Stdout + r.Stderr)
}

// reach asserts the answer to command (a GET /who) is want, or, with want
// "", that there is none.
func reach(t *testing.T, sb dkBox, command, want string) {
	t.Helper()
	_, out := sh(t, sb, command)
	if got := egresstest.WhoAnswer([]byte(out)); got != want {
		t.Errorf("%s: %q, want %q", command, out, want)
	}
}

// fails asserts command fails.
func fails(t *testing.T, sb dkBox, command string) {
	t.Helper()
	if code, out := sh(t, sb, command); code == 0 {
		t.Errorf("%s: succeeded (%q), want a failure", command, out)
	}
}

func setNetwork(t *testing.T, g *proc, sb dkBox, body string, hdr ...string) (int, string) {
	t.Helper()
	if hdr == nil {
		hdr = []string{"X-Sandbox-Lease", sb.token}
	}
	s, b := call(t, "PUT", sb.url+"/network", body, hdr...)
	return s, string(b)
}

// TestEgressLocal: a local sandbox's egress policy through the gateway's
// API, against a test internet in a namespace of its own, from a sandbox
// whose root tries to get around it.
func TestEgressLocal(t *testing.T) {
	t.Parallel()
	testEgress(t, localEgress)
}

// TestEgressDocker: the same on the docker provider, whose sandboxes the
// provider's own egress point serves.
func TestEgressDocker(t *testing.T) {
	t.Parallel()
	dockertest.Require(t)
	testEgress(t, dockerEgress)
}

func testEgress(t *testing.T, k egressKit) {
	var (
		curlA     = k.who(false, "a.test", "a.test")
		curlAtls  = k.who(true, "a.test", "a.test")
		curlBIP   = k.who(false, "198.51.100.2", "198.51.100.2")
		curlBsni  = k.who(true, "198.51.100.1", "b.test")
		curlBhost = k.who(false, "198.51.100.1", "b.test")
		curlCIDR  = k.who(false, "203.0.113.5", "203.0.113.5")
		resolveA  = k.lookup("a.test")
		resolveB  = k.lookup("b.test")
	)
	before := egresstest.Links(t)
	in := egresstest.Start(t)
	dir := t.TempDir()
	args := []string{"--api-key", "key-a,key-b", "--cap-add-allow", "NET_ADMIN", "--egress-netns", in.NetnsPath, "--egress-resolve", egresstest.ResolveFlag()}
	g := k.start(t, dir, args...)

	// Default: loopback only, no names.
	plain := k.box(t, g, "key-a", "")
	reach(t, plain, curlCIDR, "")
	fails(t, plain, resolveA)
	if _, out := sh(t, plain, "ls /sys/class/net"); out != "lo" {
		t.Errorf("links of a sandbox without egress: %q", out)
	}

	sb := k.box(t, g, "key-a", `"network":{"egress":{"allow":["a.test"]}}`)
	reach(t, sb, curlA, "a.test 198.51.100.1:80")
	if k.tls {
		reach(t, sb, curlAtls, "a.test 198.51.100.1:443")
	} else {
		sh(t, sb, curlAtls) // admitted by the point (counted below), then the handshake fails
	}
	if code, out := sh(t, sb, resolveA); code != 0 {
		t.Errorf("%s: %d %s", resolveA, code, out)
	}
	fails(t, sb, resolveB)
	reach(t, sb, curlBIP, "")
	reach(t, sb, curlBsni, "")
	reach(t, sb, curlBhost, "")
	reach(t, sb, curlCIDR, "")

	// Another key's change is refused like any other route; a bad policy
	// is 400 listing each entry and changes nothing.
	if s, b := setNetwork(t, g, sb, `{"egress":"all"}`, "Authorization", "Bearer key-b"); s != 404 && s != 403 {
		t.Errorf("PUT by another key: %d %s", s, b)
	}
	s, b := setNetwork(t, g, sb, `{"egress":{"allow":["bad domain","10.0.0.0/99"],"deny":["*"]}}`)
	if s != 400 || strings.Count(b, `"field"`) != 3 {
		t.Errorf("bad policy: %d %s", s, b)
	}
	reach(t, sb, curlA, "a.test 198.51.100.1:80")
	reach(t, sb, curlCIDR, "")

	// The info shows the policy and the sandbox's counts; /metrics the
	// totals by result only.
	s, raw := call(t, "GET", sb.url, "", "X-Sandbox-Lease", sb.token)
	var got struct {
		Extra struct {
			Egress any `json:"egress"`
			Conns  struct {
				Allowed, Denied int
			} `json:"egress_connections"`
		} `json:"extra"`
	}
	if err := json.Unmarshal(raw, &got); s != 200 || err != nil || got.Extra.Conns.Allowed < 3 || got.Extra.Conns.Denied < 3 {
		t.Errorf("info: %d %v %s", s, err, raw)
	}
	if pol, _ := json.Marshal(got.Extra.Egress); string(pol) != `{"allow":["a.test"],"deny":[]}` {
		t.Errorf("info's policy %s", pol)
	}
	_, raw = call(t, "GET", g.URL+"/metrics", "")
	for _, m := range []string{`sandgate_egress_connections_total{result="allowed"}`, `sandgate_egress_connections_total{result="denied"}`} {
		if !strings.Contains(string(raw), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}

	// A runtime change takes effect within a second.
	if s, b := setNetwork(t, g, sb, `{"egress":{"allow":["203.0.113.0/24","a.test"],"deny":["a.test"]}}`); s != 200 {
		t.Fatalf("PUT: %d %s", s, b)
	}
	deadline := time.Now().Add(time.Second)
	for {
		code, out := sh(t, sb, curlCIDR)
		if egresstest.WhoAnswer([]byte(out)) == "203.0.113.5 203.0.113.5:80" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CIDR rule not in effect after 1s: %d %q", code, out)
		}
	}
	reach(t, sb, curlA, "") // deny wins over allow

	// Creates: a bad policy is 400 and makes nothing; NeMo Gym's shape.
	s, raw = call(t, "POST", g.URL+"/v1/sandboxes", `{"network":{"egress":{"allow":["x y"]}}}`, "Authorization", "Bearer key-a")
	if s != 400 || !strings.Contains(string(raw), "network.egress.allow[0]") {
		t.Errorf("bad create: %d %s", s, raw)
	}
	gym := k.box(t, g, "key-a", `"provider_options":{"network_policy":{"defaultAction":"deny","egress":[{"action":"allow","target":"a.test"},{"action":"allow","target":"203.0.113.5"}]}}`)
	reach(t, gym, curlA, "a.test 198.51.100.1:80")
	reach(t, gym, curlCIDR, "203.0.113.5 203.0.113.5:80")
	reach(t, gym, curlBIP, "")
	// Ports with a policy: the egress point publishes them (no network of
	// their own, no second way out). The endpoint and the proxy reach the
	// sandbox's server; the sandbox still reaches only what it allows.
	ported := k.box(t, g, "key-a", `"ports":[8080],"network":{"egress":{"allow":["a.test"]}}`)
	servePorted(t, ported)
	reach(t, ported, curlA, "a.test 198.51.100.1:80")
	reach(t, ported, curlBIP, "")
	if _, out := sh(t, ported, "ls /sys/class/net | tr '\\n' ' '"); out != "eth0 lo" {
		t.Errorf("links of a sandbox with ports and a policy: %q", out)
	}
	s, raw = call(t, "GET", g.URL+"/v1/sandboxes", "", "Authorization", "Bearer key-a")
	if n := strings.Count(string(raw), `"sandbox_id"`); s != 200 || n != 4 {
		t.Errorf("list: %d, %d sandboxes, want 4", s, n)
	}

	// Root inside changes resolv.conf, addresses and routes, and sends raw
	// packets: none of it gets anything through. A local sandbox's root
	// gets NET_ADMIN in its own namespace with cap_add; a docker
	// sandbox's root holds neither NET_ADMIN nor NET_RAW: it cannot
	// change addresses or routes at all, which is checked (the docker
	// provider's TestEgress gives them with cap_add and repeats this).
	rogueSpec := `"network":{"egress":{"allow":["a.test"]}}`
	if k.netAdmin {
		rogueSpec += `,"cap_add":["NET_ADMIN"]`
	}
	rogue := k.box(t, g, "key-a", rogueSpec)
	if code, out := sh(t, rogue, "echo nameserver 198.51.100.2 > /etc/resolv.conf"); code != 0 {
		t.Fatalf("rogue resolv.conf: %d %s", code, out)
	}
	if k.netAdmin {
		if code, out := sh(t, rogue, "ip addr add 100.64.0.9/30 dev eth0"); code != 0 {
			t.Fatalf("rogue address: %d %s", code, out)
		}
	} else {
		_, out := sh(t, rogue, "grep CapEff /proc/self/status")
		eff, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(out, "CapEff:")), 16, 64)
		if err != nil || eff&(1<<12|1<<13) != 0 {
			t.Errorf("%q: want neither NET_ADMIN nor NET_RAW (%v)", out, err)
		}
		fails(t, rogue, "ip addr add 100.64.0.9/30 dev eth0")
	}
	fails(t, rogue, resolveB)
	reach(t, rogue, curlA, "a.test 198.51.100.1:80") // the DNS is the point's, whatever the address
	if k.netAdmin {
		reach(t, rogue, "curl -sS -m 3 --interface 100.64.0.9 http://198.51.100.1/who", "")
	}
	fails(t, rogue, "ping -c 1 -W 2 198.51.100.1")
	fails(t, rogue, "ping -c 1 -W 2 100.64.0.1")
	if code, out := sh(t, rogue, "ip route replace default dev eth0"); (code == 0) != k.netAdmin {
		t.Fatalf("route: %d %s", code, out)
	}
	reach(t, rogue, curlBIP, "")

	// A new gateway (the old one killed) plumbs the policies again.
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("gateway survived SIGKILL")
	}
	g = k.start(t, dir, args...)
	for _, b := range []*dkBox{&plain, &sb, &gym, &rogue, &ported} {
		b.url = g.URL + "/v1/sandboxes/" + b.id
	}
	reach(t, gym, curlA, "a.test 198.51.100.1:80")
	proxyReaches(t, ported, "ported\n") // published again by the new gateway's point
	reach(t, ported, curlA, "a.test 198.51.100.1:80")
	reach(t, ported, curlBIP, "")
	reach(t, sb, curlCIDR, "203.0.113.5 203.0.113.5:80")
	reach(t, plain, curlCIDR, "")

	for _, b := range []dkBox{plain, sb, gym, rogue, ported} {
		if s, body := call(t, "DELETE", b.url, "", "X-Sandbox-Lease", b.token); s != 204 && s != 200 {
			t.Errorf("delete: %d %s", s, body)
		}
	}
	g.stop(syscall.SIGTERM)
	in.Close()
	if added := egresstest.NewLinks(before, egresstest.Links(t)); len(added) > 0 {
		t.Errorf("links added to the host: %v", added)
	}
}

// servePorted starts an HTTP server on port 8080 of sb (busybox httpd,
// in both kits' sandboxes) and checks its endpoint and the proxy reach it.
func servePorted(t *testing.T, sb dkBox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// httpd forks into the background: keep it.
	cmd := "mkdir -p /tmp/www && echo ported > /tmp/www/index.html && busybox httpd -p 8080 -h /tmp/www"
	if s, r, err := dkExec(ctx, sb, cmd, true); err != nil || s != 200 || r.ReturnCode != 0 {
		t.Fatalf("start httpd: %v %d %+v", err, s, r)
	}
	proxyReaches(t, sb, "ported\n")
}

// proxyReaches checks that the endpoint of port 8080 of sb and the proxy
// route serve want at /index.html.
func proxyReaches(t *testing.T, sb dkBox, want string) {
	t.Helper()
	s, b := call(t, "GET", sb.url+"/endpoints/8080", "", "X-Sandbox-Lease", sb.token)
	var ep struct {
		Endpoint string `json:"endpoint"`
	}
	if json.Unmarshal(b, &ep); s != 200 || !strings.HasPrefix(ep.Endpoint, "http://127.0.0.1:") {
		t.Fatalf("endpoint: %d %s", s, b)
	}
	var body string
	testkit.Eventually(t, "httpd through the proxy", 20*time.Second, func() bool {
		s, b := call(t, "GET", sb.url+"/proxy/8080/index.html", "", "X-Sandbox-Lease", sb.token)
		body = string(b)
		return s == 200
	})
	if body != want {
		t.Errorf("through the proxy: %q, want %q", body, want)
	}
	if s, b := call(t, "GET", ep.Endpoint+"/index.html", ""); s != 200 || string(b) != want {
		t.Errorf("at the endpoint: %d %q, want %q", s, b, want)
	}
}
