package main

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
)

// egressBox creates a local sandbox (the host's view) with the create
// body's extra members, as key.
func egressBox(t *testing.T, g *proc, key, members string) dkBox {
	t.Helper()
	body := `{"ttl_s":600`
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

// reach asserts command's output (a curl of /who) is want, or, with want
// "", that it fails.
func reach(t *testing.T, sb dkBox, command, want string) {
	t.Helper()
	code, out := sh(t, sb, command)
	if want == "" && code == 0 {
		t.Errorf("%s: reached (%q), want refused", command, out)
	}
	if want != "" && (code != 0 || out != want) {
		t.Errorf("%s: exit %d %q, want %q", command, code, out, want)
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

const (
	curlA    = "curl -sS -m 5 http://a.test/who"
	curlAtls = "curl -sSk -m 5 https://a.test/who"
	curlBIP  = "curl -sS -m 3 http://198.51.100.2/who"
	curlBsni = "curl -sSk -m 3 --resolve b.test:443:198.51.100.1 https://b.test/who"
	curlCIDR = "curl -sS -m 3 http://203.0.113.5/who"
	resolveB = "getent hosts b.test"
)

// TestEgressLocal: a local sandbox's egress policy through the gateway's
// API, against a test internet in a namespace of its own, from a sandbox
// whose root tries to get around it.
func TestEgressLocal(t *testing.T) {
	before := egresstest.Links(t)
	in := egresstest.Start(t)
	dir := t.TempDir()
	args := []string{"--api-key", "key-a,key-b", "--cap-add-allow", "NET_ADMIN", "--egress-netns", in.NetnsPath, "--egress-resolve", egresstest.ResolveFlag()}
	g := startGateway(t, dir, nil, args...)

	// Default: loopback only, no names.
	plain := egressBox(t, g, "key-a", "")
	reach(t, plain, curlCIDR, "")
	reach(t, plain, "getent hosts a.test", "")
	if _, out := sh(t, plain, "ls /sys/class/net"); out != "lo" {
		t.Errorf("links of a sandbox without egress: %q", out)
	}

	sb := egressBox(t, g, "key-a", `"network":{"egress":{"allow":["a.test"]}}`)
	reach(t, sb, curlA, "a.test 198.51.100.1:80")
	reach(t, sb, curlAtls, "a.test 198.51.100.1:443")
	reach(t, sb, resolveB, "")
	reach(t, sb, curlBIP, "")
	reach(t, sb, curlBsni, "")
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
		if code == 0 && out == "203.0.113.5 203.0.113.5:80" {
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
	gym := egressBox(t, g, "key-a", `"provider_options":{"network_policy":{"defaultAction":"deny","egress":[{"action":"allow","target":"a.test"},{"action":"allow","target":"203.0.113.5"}]}}`)
	reach(t, gym, curlA, "a.test 198.51.100.1:80")
	reach(t, gym, curlCIDR, "203.0.113.5 203.0.113.5:80")
	reach(t, gym, curlBIP, "")
	s, raw = call(t, "GET", g.URL+"/v1/sandboxes", "", "Authorization", "Bearer key-a")
	if n := strings.Count(string(raw), `"sandbox_id"`); s != 200 || n != 3 {
		t.Errorf("list after a refused create: %d, %d sandboxes", s, n)
	}

	// Root inside (with NET_ADMIN in its namespace) changes resolv.conf,
	// addresses and routes, and sends raw packets: none of it gets
	// anything through.
	rogue := egressBox(t, g, "key-a", `"network":{"egress":{"allow":["a.test"]}},"cap_add":["NET_ADMIN"]`)
	if code, out := sh(t, rogue, "echo nameserver 198.51.100.2 > /etc/resolv.conf && ip addr add 100.64.0.9/30 dev eth0"); code != 0 {
		t.Fatalf("rogue setup: %d %s", code, out)
	}
	reach(t, rogue, resolveB, "")
	reach(t, rogue, curlA, "a.test 198.51.100.1:80") // the DNS is the point's, whatever the address
	reach(t, rogue, "curl -sS -m 3 --interface 100.64.0.9 http://198.51.100.1/who", "")
	reach(t, rogue, "ping -c 1 -W 2 198.51.100.1", "")
	reach(t, rogue, "ping -c 1 -W 2 100.64.0.1", "")
	if code, out := sh(t, rogue, "ip route replace default dev eth0"); code != 0 {
		t.Fatalf("route: %d %s", code, out)
	}
	reach(t, rogue, curlBIP, "")

	// A new gateway (the old one killed) plumbs the policies again.
	if err := g.stop(syscall.SIGKILL); err == nil {
		t.Fatal("gateway survived SIGKILL")
	}
	g = startGateway(t, dir, nil, args...)
	for _, b := range []*dkBox{&plain, &sb, &gym, &rogue} {
		b.url = g.URL + "/v1/sandboxes/" + b.id
	}
	reach(t, gym, curlA, "a.test 198.51.100.1:80")
	reach(t, sb, curlCIDR, "203.0.113.5 203.0.113.5:80")
	reach(t, plain, curlCIDR, "")

	for _, b := range []dkBox{plain, sb, gym, rogue} {
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
