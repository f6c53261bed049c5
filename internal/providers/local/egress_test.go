package local

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestSetEgress: a sandbox gets eth0 with its first policy other than
// none, reaches what the policy allows, and its veth goes with Delete;
// isolation none has no namespace to attach.
func TestSetEgress(t *testing.T) {
	in := egresstest.Start(t)
	l := newLocal(t, Options{Egress: point.Options{Resolve: egresstest.Resolve(), EgressNetns: in.NetnsPath}})
	id := create(t, l, providers.CreateSpec{})
	if err := l.SetEgress(ctxT(t), id, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, l, id, "ls /sys/class/net"); strings.TrimSpace(out) != "lo" {
		t.Errorf("links with none: %q", out)
	}
	var pol egress.Policy
	if err := json.Unmarshal([]byte(`{"allow":["a.test"]}`), &pol); err != nil {
		t.Fatal(err)
	}
	if err := l.SetEgress(ctxT(t), id, pol); err != nil {
		t.Fatal(err)
	}
	if out, _ := sh(t, l, id, "ls /sys/class/net | tr '\\n' ' '"); out != "eth0 lo " {
		t.Errorf("links with a policy: %q", out)
	}
	if out, code := sh(t, l, id, "curl -sS -m 5 http://a.test/who"); code != 0 || out != "a.test 198.51.100.1:80\n" {
		t.Errorf("a.test: %d %q", code, out)
	}
	if st := l.EgressStats(id); st.Allowed != 1 {
		t.Errorf("stats %+v", st)
	}
	if err := l.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	if st := l.EgressStats(id); st != (egress.Stats{}) {
		t.Errorf("stats after delete %+v", st)
	}

	none := newLocal(t, Options{Isolation: IsolationNone})
	nid := create(t, none, providers.CreateSpec{})
	if err := none.SetEgress(ctxT(t), nid, pol); !errors.Is(err, providers.ErrUnsupported) {
		t.Errorf("isolation none: %v", err)
	}
}

// TestEndpoint: a port of a sandbox (with a policy, or none: attached
// here) is published on 127.0.0.1 by the egress point and serves what the
// sandbox serves there; the sandbox with a policy still reaches only what
// it allows; isolation none publishes nothing.
func TestEndpoint(t *testing.T) {
	t.Parallel()
	in := egresstest.Start(t)
	l := newLocal(t, Options{Egress: point.Options{Resolve: egresstest.Resolve(), EgressNetns: in.NetnsPath}})
	var pol egress.Policy
	if err := json.Unmarshal([]byte(`{"allow":["a.test"]}`), &pol); err != nil {
		t.Fatal(err)
	}
	withPolicy := create(t, l, providers.CreateSpec{Ports: []int{8080}, Egress: &pol})
	if err := l.SetEgress(ctxT(t), withPolicy, pol); err != nil {
		t.Fatal(err)
	}
	plain := create(t, l, providers.CreateSpec{Ports: []int{8080}})
	for _, id := range []string{withPolicy, plain} {
		res, err := l.Exec(ctxT(t), id, providers.ExecRequest{
			Command:            "mkdir -p /tmp/www && echo served-by-" + id + " > /tmp/www/index.html && busybox httpd -p 8080 -h /tmp/www",
			PreserveBackground: true, Timeout: 30 * time.Second, MaxOutput: 1024,
		})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("httpd in %s: %v %+v", id, err, res)
		}
		ep, err := l.Endpoint(ctxT(t), id, 8080)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(ep.URL, "http://127.0.0.1:") {
			t.Errorf("endpoint %q", ep.URL)
		}
		got := testkit.EventuallyGet(t, ep.URL+"/", 20*time.Second)
		if got != "served-by-"+id+"\n" {
			t.Errorf("endpoint of %s: %q", id, got)
		}
	}
	if out, code := sh(t, l, withPolicy, "curl -sS -m 5 http://a.test/who"); code != 0 || out != "a.test 198.51.100.1:80\n" {
		t.Errorf("a.test: %d %q", code, out)
	}
	for _, c := range []struct{ id, url string }{{withPolicy, "http://198.51.100.2/who"}, {plain, "http://198.51.100.1/who"}} {
		if out, code := sh(t, l, c.id, "curl -sS -m 3 "+c.url); code == 0 {
			t.Errorf("%s reached %s: %q", c.id, c.url, out)
		}
	}

	none := newLocal(t, Options{Isolation: IsolationNone})
	nid := create(t, none, providers.CreateSpec{Ports: []int{8080}})
	if _, err := none.Endpoint(ctxT(t), nid, 8080); !errors.Is(err, providers.ErrUnsupported) {
		t.Errorf("isolation none: %v", err)
	}
}
