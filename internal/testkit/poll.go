package testkit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// pollEvery is how often Eventually and Until check their condition: short
// enough not to slow a test down, long enough not to load the machine.
const pollEvery = 10 * time.Millisecond

// Eventually polls cond until it holds, failing t when timeout passes
// first with the message "timed out after <timeout> waiting for <what>".
// The timeout catches a hang: make it generous (10x the expected time).
// It must be called on the test's goroutine (it calls t.Fatalf); off it,
// use Until.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	EventuallyNil(t, what, timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
}

// EventuallyNil is Eventually for a condition that says why it does not
// hold yet: it polls until cond returns nil, and on timeout reports the
// last error with what.
func EventuallyNil(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := until(ctx, cond); err != nil {
		if err == errNotYet {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		t.Fatalf("timed out after %v waiting for %s; last: %v", timeout, what, err)
	}
}

// Until polls cond until it holds, returning nil, or until ctx is done,
// returning ctx's error. It does not touch a testing.T, so a goroutine
// other than the test's may use it.
func Until(ctx context.Context, cond func() bool) error {
	err := until(ctx, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		return context.Cause(ctx)
	}
	return nil
}

type notYet struct{}

func (notYet) Error() string { return "condition not met" }

var errNotYet error = notYet{}

// until polls cond until it returns nil (returning nil) or ctx is done
// (returning cond's last error).
func until(ctx context.Context, cond func() error) error {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// EventuallyGet polls GET url until it answers 200, failing t when timeout
// passes first, and returns that answer's body (a server that is still
// starting is waited for). Call it on the test's goroutine.
func EventuallyGet(t testing.TB, url string, timeout time.Duration) string {
	t.Helper()
	var body string
	EventuallyNil(t, "GET "+url, timeout, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		body = string(b)
		return nil
	})
	return body
}
