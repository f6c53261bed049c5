// Package testkit is the shared support of sandgate's tests: polling a
// condition with a deadline, contexts bound to a test, requirements that
// skip locally and fail in CI, a cuttable proxy, the gateway and agent
// binaries built once per test binary, a sandbox created with its
// clean-up, and a fake clock.
//
// It imports only the standard library and the providers contract, so any
// package's tests can use it; kit parts that need heavier packages live in
// subpackages (testkit/terminals).
package testkit

import (
	"context"
	"flag"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// CI reports whether the tests run in CI (CI=true), where a missing
// dependency is a failure instead of a skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Need skips t when err is not nil, or fails it in CI: what names the
// dependency and how to get it ("a docker daemon (scripts/ci-docker.sh
// starts one)"). Every requirement of the tests goes through it.
func Need(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if CI() {
		t.Fatalf("%s is required in CI: %v", what, err)
	}
	t.Skipf("needs %s: %v", what, err)
}

// errNotRoot is RequireRoot's reason.
type errNotRoot int

func (u errNotRoot) Error() string { return "running as uid " + strconv.Itoa(int(u)) }

// RequireRoot skips t unless it runs as root (fails in CI).
func RequireRoot(t testing.TB) {
	t.Helper()
	if uid := os.Geteuid(); uid != 0 {
		Need(t, "root", errNotRoot(uid))
	}
}

// Context returns a context cancelled when d passes or at t's clean-up,
// whichever comes first. Unlike t.Context it is still live in clean-up
// functions registered after it (they run first), so a deferred delete
// may use it.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// WaitingParallel sets how many of a package's parallel tests run at once
// (-test.parallel) to n, unless the command line set it. Call it from
// TestMain after flag.Parse, in packages whose tests spend their time
// waiting on processes, sandboxes, daemons or the cluster rather than the
// CPU: go test's default, GOMAXPROCS (2 on the CI machine), leaves the
// cores idle while they wait.
func WaitingParallel(n int) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}
