package sandbox

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// TestExecOutputBudget: each exec reserves room for two full streams; one
// that finds less left gets half of what is left per stream (never less
// than the floor) and its output is cut there, with truncated set; a
// finished exec keeps only what its output takes, and a released result
// gives that back, once.
func TestExecOutputBudget(t *testing.T) {
	const perStream = 1 << 20
	e := newEnv(t, func(o *Options) { o.MaxExecOutput = perStream; o.MaxExecOutputTotal = 3 << 20 })
	ctx := context.Background()
	a := e.create(t, CreateRequest{})
	e.p.ExecFunc = func(ctx context.Context, id string, req providers.ExecRequest) (providers.ExecResult, error) {
		switch req.Command {
		case "fail":
			return providers.ExecResult{}, errors.New("runtime gone")
		case "small":
			return providers.ExecResult{Stdout: []byte("hello\n"), Stderr: []byte("warn\n")}, nil
		}
		out := bytes.Repeat([]byte{0}, 2<<20) // more than any cap: every result is cut
		return providers.ExecResult{Stdout: out[:req.MaxOutput], Stderr: out[:req.MaxOutput], Truncated: true}, nil
	}
	exec := func(want int) ExecResult {
		t.Helper()
		res, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "x"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Stdout) != want || len(res.Stderr) != want || !res.Truncated {
			t.Fatalf("granted %d/%d bytes (truncated %v), want %d", len(res.Stdout), len(res.Stderr), res.Truncated, want)
		}
		return res
	}
	inUse := func(want int64) {
		t.Helper()
		if got := e.svc.out.inUse(); got != want {
			t.Fatalf("budget in use %d, want %d", got, want)
		}
	}
	r1 := exec(perStream)          // 2 MiB of 3 taken
	r2 := exec(perStream / 2)      // half of the 1 MiB left, per stream
	r3 := exec(minExecOutput)      // nothing left: the floor
	inUse(3<<20 + 2*minExecOutput) // the floor is the only overdraft
	r1.Release()
	r1.Release() // a second release gives nothing back
	inUse(1<<20 + 2*minExecOutput)
	left := int64(3<<20) - (1<<20 + 2*minExecOutput)
	r4 := exec(int(left / 2))
	for _, r := range []ExecResult{r2, r3, r4} {
		r.Release()
	}
	inUse(0)
	exec(perStream).Release()
	inUse(0)
	// Once the command is done, a result holds room only for what it holds.
	small, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "small"})
	if err != nil || small.Truncated {
		t.Fatal(err, small.Truncated)
	}
	inUse(11)
	small.Release()
	inUse(0)
	// A runtime failure holds nothing once Exec returns.
	res, err := e.svc.Exec(ctx, lease(a.Token), a.SandboxID, ExecRequest{Command: "fail"})
	if err != nil || res.ErrorType != ExecSandbox {
		t.Fatalf("runtime failure: %v %+v", err, res)
	}
	inUse(0)
	res.Release()
	ExecResult{}.Release()
	inUse(0)
}

// TestOutputBudgetPerKey: one key at its whole budget leaves another
// key's untouched; all keys together stop at outputKeys budgets, where
// only the floor is granted; released room comes back to its key.
func TestOutputBudgetPerKey(t *testing.T) {
	const perStream = 1 << 20
	b := newOutputBudget(4 << 20) // two full execs per key
	var held []*reservation
	take := func(key string, want int) {
		t.Helper()
		got, r := b.reserve(key, perStream)
		if got != want {
			t.Fatalf("key %s granted %d per stream, want %d", key, got, want)
		}
		held = append(held, r)
	}
	pop := func() { held[len(held)-1].release(); held = held[:len(held)-1] }
	take("a", perStream)
	take("a", perStream)
	take("a", minExecOutput) // a's budget is spent
	pop()
	take("b", perStream) // b's is not
	take("b", perStream)
	for _, k := range []string{"c", "d"} {
		take(k, perStream)
		take(k, perStream)
	}
	// Four keys at their whole budgets: the gateway's bound is reached.
	take("e", minExecOutput)
	pop()
	held[0].release()
	take("e", perStream) // a's released room is the gateway's again
	for _, r := range held {
		r.release()
	}
	if b.inUse() != 0 || len(b.byKey) != 0 {
		t.Fatalf("after releasing all: %d in use, %v", b.inUse(), b.byKey)
	}
}
