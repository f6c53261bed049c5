package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/fake"
	"github.com/sandgate/sandgate/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	svc   *Service
	p     *fake.Provider
	clock *testkit.Clock
	dir   string
	opts  Options
}

func newEnv(t *testing.T, mod func(*Options)) *env {
	t.Helper()
	e := &env{p: fake.New(), clock: testkit.NewClock(time.Unix(1_800_000_000, 0)), dir: t.TempDir()}
	e.opts = Options{Provider: e.p, StateDir: e.dir, AllowAnonymous: true, Clock: e.clock, ReapInterval: time.Hour}
	if mod != nil {
		mod(&e.opts)
	}
	e.restart(t)
	return e
}

// restart closes the service (if open) and opens a new one on the same
// state dir and provider, as a gateway restart does.
func (e *env) restart(t *testing.T) {
	t.Helper()
	if e.svc != nil {
		e.svc.Close()
	}
	svc, err := New(context.Background(), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	t.Cleanup(func() {
		if e.svc == svc {
			svc.Close()
		}
	})
}

func (e *env) create(t *testing.T, req CreateRequest) Ref {
	t.Helper()
	ref, err := e.svc.Create(context.Background(), Caller{}, req)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

func lease(tok string) Caller { return Caller{Lease: tok} }

func wantKind(t *testing.T, err, kind error) {
	t.Helper()
	if providers.Kind(err) != kind {
		t.Fatalf("error %v: kind %v, want %v", err, providers.Kind(err), kind)
	}
}

func dur(d time.Duration) *time.Duration { return &d }

func TestLifecycleAndScopes(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	owner := e.create(t, CreateRequest{Metadata: map[string]string{"task": "a"}, Files: map[string]string{"hello.txt": "hi"}})
	if !strings.HasPrefix(owner.SandboxID, "sbx-") || len(owner.SandboxID) != 24 || owner.Scope != ScopeOwner {
		t.Fatalf("ref %+v", owner)
	}
	id := owner.SandboxID

	rc, size, err := e.svc.ReadFile(ctx, lease(owner.Token), id, "hello.txt", 0)
	if err != nil || size != 2 {
		t.Fatalf("read seeded file: %v size %d", err, size)
	}
	rc.Close()

	op, err := e.svc.Mint(ctx, lease(owner.Token), id, ScopeOperate, nil)
	if err != nil || op.Token == owner.Token || op.Scope != ScopeOperate {
		t.Fatalf("mint operate: %v %+v", err, op)
	}
	res, err := e.svc.Exec(ctx, lease(op.Token), id, ExecRequest{Command: "echo hi"})
	if err != nil || string(res.Stdout) != "echo hi" {
		t.Fatalf("exec with operate: %v %+v", err, res)
	}
	_, err = e.svc.Mint(ctx, lease(op.Token), id, ScopeOwner, nil)
	wantKind(t, err, providers.ErrForbidden)
	wantKind(t, e.svc.Delete(ctx, lease(op.Token), id), providers.ErrForbidden)
	_, err = e.svc.Pause(ctx, lease(op.Token), id)
	wantKind(t, err, providers.ErrForbidden)

	n, err := e.svc.Release(ctx, lease(op.Token), id)
	if err != nil || n != 1 {
		t.Fatalf("release: %v remaining %d", err, n)
	}
	_, err = e.svc.Get(ctx, lease(op.Token), id)
	wantKind(t, err, providers.ErrUnauthorized)

	if err := e.svc.Delete(ctx, lease(owner.Token), id); err != nil {
		t.Fatal(err)
	}
	if e.p.Has(id) {
		t.Fatal("provider still holds the deleted sandbox")
	}
	wantKind(t, e.svc.Delete(ctx, lease(owner.Token), id), providers.ErrNotFound)
	_, err = e.svc.Get(ctx, lease(op.Token), id)
	wantKind(t, err, providers.ErrNotFound)
}

func TestTokenChecks(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	b := e.create(t, CreateRequest{})
	short, err := e.svc.Mint(ctx, lease(a.Token), a.SandboxID, ScopeOperate, dur(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	forged := a.Token[:len(a.Token)-2] + "AA"
	if forged == a.Token {
		forged = a.Token[:len(a.Token)-2] + "BB"
	}
	for _, tc := range []struct {
		name string
		c    Caller
		id   string
		want error
	}{
		{"none", Caller{}, a.SandboxID, providers.ErrUnauthorized},
		{"garbage", lease("nope"), a.SandboxID, providers.ErrUnauthorized},
		{"prefix only", lease(tokenPrefix), a.SandboxID, providers.ErrUnauthorized},
		{"forged mac", lease(forged), a.SandboxID, providers.ErrUnauthorized},
		{"other sandbox", lease(b.Token), a.SandboxID, providers.ErrForbidden},
		{"unknown id", lease(a.Token), "sbx-aaaaaaaaaaaaaaaaaaaa", providers.ErrForbidden},
		{"bearer lease", Caller{Bearer: a.Token}, a.SandboxID, nil},
		{"valid", lease(short.Token), a.SandboxID, nil},
	} {
		_, err := e.svc.Get(ctx, tc.c, tc.id)
		if providers.Kind(err) != tc.want {
			t.Errorf("%s: %v, want kind %v", tc.name, err, tc.want)
		}
	}
	e.clock.Advance(2 * time.Minute)
	_, err = e.svc.Get(ctx, lease(short.Token), a.SandboxID)
	wantKind(t, err, providers.ErrUnauthorized)
	if !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired token error: %v", err)
	}
}

func TestAPIKeys(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.APIKeys = []string{"k1", "k2"} })
	ctx := context.Background()
	_, err := e.svc.Create(ctx, Caller{}, CreateRequest{})
	wantKind(t, err, providers.ErrUnauthorized)
	_, err = e.svc.Create(ctx, Caller{Bearer: "wrong"}, CreateRequest{})
	wantKind(t, err, providers.ErrUnauthorized)
	ref, err := e.svc.Create(ctx, Caller{Bearer: "k1"}, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Get(ctx, Caller{Bearer: "k1"}, ref.SandboxID); err != nil {
		t.Fatalf("creator key: %v", err)
	}
	_, err = e.svc.Get(ctx, Caller{Bearer: "k2"}, ref.SandboxID)
	wantKind(t, err, providers.ErrForbidden)
	l1, _ := e.svc.List(ctx, Caller{Bearer: "k1"}, ListFilter{})
	l2, _ := e.svc.List(ctx, Caller{Bearer: "k2"}, ListFilter{})
	if len(l1) != 1 || len(l2) != 0 {
		t.Fatalf("list per key: %d %d", len(l1), len(l2))
	}
	_, err = e.svc.List(ctx, Caller{Bearer: ref.Token}, ListFilter{})
	wantKind(t, err, providers.ErrUnauthorized)
}

func TestListFilters(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{Metadata: map[string]string{"env": "x"}})
	e.create(t, CreateRequest{Metadata: map[string]string{"env": "y"}})
	if _, err := e.svc.Pause(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	got, _ := e.svc.List(ctx, Caller{}, ListFilter{Label: "env=x"})
	if len(got) != 1 || got[0].ID != a.SandboxID {
		t.Fatalf("label filter: %+v", got)
	}
	got, _ = e.svc.List(ctx, Caller{}, ListFilter{Status: providers.StatePaused})
	if len(got) != 1 || got[0].ID != a.SandboxID {
		t.Fatalf("status filter: %+v", got)
	}
	_, err := e.svc.List(ctx, Caller{}, ListFilter{Label: "novalue"})
	wantKind(t, err, providers.ErrInvalid)
}

func TestPausedRefusesExec(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	if _, err := e.svc.Pause(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	_, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "true"})
	wantKind(t, err, providers.ErrConflict)
	_, err = e.svc.Pause(ctx, lease(a.Token), a.SandboxID)
	wantKind(t, err, providers.ErrConflict)
	if _, err := e.svc.Resume(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "true"}); err != nil {
		t.Fatal(err)
	}
}

func TestExecOutcomes(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	e.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		switch req.Command {
		case "timeout":
			return providers.ExecResult{Stdout: []byte("partial"), ExitCode: 125, TimedOut: true}, nil
		case "broken":
			return providers.ExecResult{}, errors.New("runtime exploded at /var/lib/secret")
		case "cwd":
			return providers.ExecResult{Stdout: []byte(req.Cwd)}, nil
		}
		return providers.ExecResult{ExitCode: 3}, nil
	}
	res, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "timeout"})
	if err != nil || res.ReturnCode != 125 || res.ErrorType != ExecTimeout || string(res.Stdout) != "partial" {
		t.Fatalf("timeout: %v %+v", err, res)
	}
	res, err = e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "broken"})
	if err != nil || res.ReturnCode != 125 || res.ErrorType != ExecSandbox || strings.Contains(string(res.Stderr), "/var/lib") {
		t.Fatalf("runtime failure: %v %+v", err, res)
	}
	res, _ = e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "cwd", Cwd: "sub/dir"})
	if string(res.Stdout) != "/workspace/sub/dir" {
		t.Fatalf("relative cwd resolved to %q", res.Stdout)
	}
	res, _ = e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "x"})
	if res.ReturnCode != 3 || res.ErrorType != "" {
		t.Fatalf("nonzero exit: %+v", res)
	}
	bad := "!!"
	_, err = e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "", Cwd: "../x", StdinB64: &bad, Timeout: dur(-1)})
	var f providers.InvalidFields
	if !errors.As(err, &f) || len(f) != 4 {
		t.Fatalf("want all four problems at once, got %v", err)
	}
	// A sandbox that stopped by itself answers 409, not a 125 result.
	e.p.Stop(a.SandboxID)
	e.p.ExecFunc = nil
	_, err = e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "true"})
	wantKind(t, err, providers.ErrConflict)
	info, _ := e.svc.Get(ctx, lease(a.Token), a.SandboxID)
	if info.State != providers.StateStopped {
		t.Fatalf("state after stop: %s", info.State)
	}
}

func TestCreateValidation(t *testing.T) {
	e := newEnv(t, nil)
	_, err := e.svc.Create(context.Background(), Caller{}, CreateRequest{
		Workdir: "rel", Ports: []int{80, 80, 70000}, TTL: dur(-time.Second),
		Files: map[string]string{"../etc/passwd": "x"},
	})
	var f providers.InvalidFields
	if !errors.As(err, &f) || len(f) != 5 {
		t.Fatalf("want five problems, got %v", err)
	}
	_, err = e.svc.Create(context.Background(), Caller{}, CreateRequest{ProviderOptions: map[string]any{"bogus": 1}})
	wantKind(t, err, providers.ErrInvalid)
	if !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown option not named: %v", err)
	}
	if l, _ := e.p.List(context.Background()); len(l) != 0 {
		t.Fatalf("failed creates left %d sandboxes", len(l))
	}
	// The slot of a failed create is free again.
	if got := e.svc.slots.used; got != 0 {
		t.Fatalf("slots used after failed creates: %d", got)
	}
}

func TestRestartKeepsLeases(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	op, _ := e.svc.Mint(ctx, lease(a.Token), a.SandboxID, ScopeOperate, nil)
	gone, _ := e.svc.Mint(ctx, lease(a.Token), a.SandboxID, ScopeOperate, nil)
	if _, err := e.svc.Release(ctx, lease(gone.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	vanished := e.create(t, CreateRequest{})
	e.p.Vanish(vanished.SandboxID)
	e.p.Adopt("sbx-orphanorphanorphanor")

	e.restart(t)
	if _, err := e.svc.Exec(ctx, lease(op.Token), a.SandboxID, ExecRequest{Command: "true"}); err != nil {
		t.Fatalf("operate token after restart: %v", err)
	}
	_, err := e.svc.Get(ctx, lease(gone.Token), a.SandboxID)
	wantKind(t, err, providers.ErrUnauthorized)
	info, err := e.svc.Get(ctx, lease(vanished.Token), vanished.SandboxID)
	if err != nil || info.State != providers.StateStopped {
		t.Fatalf("vanished sandbox: %v %s", err, info.State)
	}
	if e.p.Has("sbx-orphanorphanorphanor") {
		t.Fatal("orphan not removed at start-up")
	}
	if got := e.svc.slots.used; got != 1 {
		t.Fatalf("slots after adoption: %d, want 1", got)
	}
}

func TestTTLAndRenew(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{TTL: dur(10 * time.Second)})
	forever := e.create(t, CreateRequest{TTL: dur(0)})
	e.clock.Advance(8 * time.Second)
	if _, err := e.svc.Renew(ctx, lease(a.Token), a.SandboxID, nil); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(8 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 0 {
		t.Fatalf("renewed sandbox reaped")
	}
	e.clock.Advance(3 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 1 {
		t.Fatalf("reaped %d, want 1", n)
	}
	_, err := e.svc.Get(ctx, lease(a.Token), a.SandboxID)
	wantKind(t, err, providers.ErrNotFound)
	if e.p.Has(a.SandboxID) {
		t.Fatal("expired sandbox still in the provider")
	}
	e.clock.Advance(1000 * time.Hour)
	if _, err := e.svc.Get(ctx, lease(forever.Token), forever.SandboxID); err != nil {
		t.Fatalf("ttl 0 sandbox: %v", err)
	}
}

func TestIdleTimeout(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	a := e.create(t, CreateRequest{IdleTimeout: dur(5 * time.Second)})
	release := make(chan struct{})
	started := make(chan struct{})
	e.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		close(started)
		<-release
		return providers.ExecResult{}, nil
	}
	done := make(chan error)
	go func() {
		_, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "long"})
		done <- err
	}()
	<-started
	e.clock.Advance(time.Minute)
	if n := e.svc.reap(e.clock.Now()); n != 0 {
		t.Fatal("sandbox with an exec in flight reaped as idle")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	unhold := e.svc.Hold(a.SandboxID)
	e.clock.Advance(time.Minute)
	if n := e.svc.reap(e.clock.Now()); n != 0 {
		t.Fatal("held sandbox reaped as idle")
	}
	unhold()
	e.clock.Advance(4 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 0 {
		t.Fatal("reaped before the idle timeout")
	}
	e.clock.Advance(2 * time.Second)
	if n := e.svc.reap(e.clock.Now()); n != 1 {
		t.Fatal("idle sandbox not reaped")
	}
}

func TestCapacityQueue(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxSandboxes = 2; o.QueueTimeout = 5 * time.Second })
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	e.create(t, CreateRequest{})

	third := make(chan error, 1)
	go func() {
		_, err := e.svc.Create(ctx, Caller{}, CreateRequest{})
		third <- err
	}()
	testkit.Eventually(t, "one create queued", 10*time.Second, func() bool { return e.svc.slots.waiting() == 1 })
	select {
	case err := <-third:
		t.Fatalf("third create did not wait: %v", err)
	default:
	}
	if err := e.svc.Delete(ctx, lease(a.Token), a.SandboxID); err != nil {
		t.Fatal(err)
	}
	if err := <-third; err != nil {
		t.Fatalf("queued create: %v", err)
	}

	// Full again: a create with a short queue timeout gets ErrUnavailable.
	e.svc.opts.QueueTimeout = 50 * time.Millisecond
	_, err := e.svc.Create(ctx, Caller{}, CreateRequest{})
	wantKind(t, err, providers.ErrUnavailable)
	if e.svc.slots.waiting() != 0 {
		t.Fatal("timed-out waiter left in the queue")
	}
	// A cancelled waiter leaves the queue too.
	cctx, cancel := context.WithCancel(ctx)
	e.svc.opts.QueueTimeout = time.Minute
	go func() {
		// Off the test goroutine, so Until rather than Eventually; the
		// test's own create returns when cctx ends either way.
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		testkit.Until(wctx, func() bool { return e.svc.slots.waiting() == 1 })
		cancel()
	}()
	_, err = e.svc.Create(cctx, Caller{}, CreateRequest{})
	if !errors.Is(err, context.Canceled) || e.svc.slots.waiting() != 0 {
		t.Fatalf("cancelled waiter: %v, waiting %d", err, e.svc.slots.waiting())
	}
}

func TestQueueIsFIFO(t *testing.T) {
	s := newSlots(1)
	ctx := context.Background()
	if err := s.acquire(ctx, demand{}, time.Second); err != nil {
		t.Fatal(err)
	}
	order := make(chan int, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.acquire(ctx, demand{}, time.Minute); err != nil {
				t.Error(err)
			}
			order <- i
			s.release(demand{})
		}()
		testkit.Eventually(t, "waiter i queued", 10*time.Second, func() bool { return s.waiting() == i+1 })
	}
	s.release(demand{})
	wg.Wait()
	for want := range 3 {
		if got := <-order; got != want {
			t.Fatalf("served %d, want %d", got, want)
		}
	}
	if s.used != 0 {
		t.Fatalf("used %d after all released", s.used)
	}
}
