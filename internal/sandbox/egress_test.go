package sandbox

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/providers"
)

// egressProvider is the fake provider with policies: it records the
// last policy set per sandbox.
type egressProvider struct {
	providers.Provider
	mu   sync.Mutex
	last map[string]string // id → policy as JSON
	sets int
}

func (p *egressProvider) SetEgress(_ context.Context, id string, pol egress.Policy) error {
	b, _ := json.Marshal(pol)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last[id] = string(b)
	p.sets++
	return nil
}

func (p *egressProvider) policy(id string) (string, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last[id], p.sets
}

func policy(t *testing.T, s string) *egress.Policy {
	t.Helper()
	p, bad := egress.Parse(json.RawMessage(s))
	if len(bad) > 0 {
		t.Fatal(bad)
	}
	return &p
}

func TestEgressUnsupportedProvider(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	_, err := e.svc.Create(ctx, Caller{}, CreateRequest{Egress: policy(t, `"all"`)})
	wantKind(t, err, providers.ErrUnsupported)
	if owned, _ := e.p.List(ctx); len(owned) != 0 {
		t.Errorf("a refused create left %d sandboxes", len(owned))
	}
	a := e.create(t, CreateRequest{Egress: policy(t, `"none"`)})
	if _, err := e.svc.SetNetwork(ctx, lease(a.Token), a.SandboxID, egress.Policy{}); err != nil {
		t.Errorf("none on a provider without policies: %v", err)
	}
	_, err = e.svc.SetNetwork(ctx, lease(a.Token), a.SandboxID, *policy(t, `{"allow":["a.test"]}`))
	wantKind(t, err, providers.ErrUnsupported)
}

func TestEgressSetKeptAndRestored(t *testing.T) {
	ep := &egressProvider{last: map[string]string{}}
	e := newEnv(t, func(o *Options) { ep.Provider = o.Provider; o.Provider = ep })
	ctx := context.Background()
	a := e.create(t, CreateRequest{Egress: policy(t, `{"allow":["a.test"]}`)})
	if got, _ := ep.policy(a.SandboxID); got != `{"allow":["a.test"],"deny":[]}` {
		t.Fatalf("at create: %s", got)
	}
	b := e.create(t, CreateRequest{})
	if got, _ := ep.policy(b.SandboxID); got != "" {
		t.Errorf("a sandbox without a policy got %s", got)
	}
	// Another caller's change is refused; the owner's is applied and kept.
	other := e.create(t, CreateRequest{})
	_, err := e.svc.SetNetwork(ctx, lease(other.Token), a.SandboxID, egress.Policy{Mode: egress.ModeAll})
	if err == nil {
		t.Error("another sandbox's lease changed the policy")
	}
	if _, err := e.svc.SetNetwork(ctx, lease(a.Token), a.SandboxID, *policy(t, `{"allow":["10.0.0.0/8"]}`)); err != nil {
		t.Fatal(err)
	}
	_, before := ep.policy(a.SandboxID)
	e.restart(t)
	got, after := ep.policy(a.SandboxID)
	if got != `{"allow":["10.0.0.0/8"],"deny":[]}` || after != before+1 {
		t.Errorf("after restart: %s, %d sets (were %d)", got, after, before)
	}
}

// checkingProvider is egressProvider that cannot enforce domain rules
// (as kubernetes): CheckEgress refuses them.
type checkingProvider struct{ egressProvider }

func (p *checkingProvider) CheckEgress(pol egress.Policy) error {
	for _, r := range append(append([]egress.Rule{}, pol.Allow...), pol.Deny...) {
		if r.Domain != "" {
			return providers.Errorf(providers.ErrUnsupported, "no domain rules here")
		}
	}
	return nil
}

// TestEgressCheckedBeforeCreate: a policy the provider's CheckEgress
// refuses is refused before anything is made.
func TestEgressCheckedBeforeCreate(t *testing.T) {
	cp := &checkingProvider{egressProvider{last: map[string]string{}}}
	e := newEnv(t, func(o *Options) { cp.Provider = o.Provider; o.Provider = cp })
	ctx := context.Background()
	_, err := e.svc.Create(ctx, Caller{}, CreateRequest{Egress: policy(t, `{"allow":["a.test"]}`)})
	wantKind(t, err, providers.ErrUnsupported)
	if owned, _ := e.p.List(ctx); len(owned) != 0 {
		t.Errorf("a refused create made %d sandboxes", len(owned))
	}
	if _, sets := cp.policy(""); sets != 0 {
		t.Errorf("SetEgress called %d times", sets)
	}
	a := e.create(t, CreateRequest{Egress: policy(t, `{"allow":["10.0.0.0/8"]}`)})
	if got, _ := cp.policy(a.SandboxID); got == "" {
		t.Error("a CIDR policy was not set")
	}
}
