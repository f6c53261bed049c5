package local

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/providers"
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
