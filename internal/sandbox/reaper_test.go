package sandbox

import (
	"testing"
	"testing/synctest"
	"time"
)

// The reaper's own loop, on the bubble's clock: an idle sandbox goes at
// the first tick past its idle timeout, an expired one at the first tick
// past its TTL, a busy-free fresh one stays, and Close stops the loop.
func TestReaperLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(o *Options) { o.Clock = nil; o.ReapInterval = 10 * time.Second })
		idle := e.create(t, CreateRequest{IdleTimeout: dur(25 * time.Second)})
		expiring := e.create(t, CreateRequest{TTL: dur(45 * time.Second)})
		stays := e.create(t, CreateRequest{TTL: dur(0)})

		// Ticks at 10 s and 20 s: nothing is due.
		time.Sleep(25 * time.Second)
		synctest.Wait()
		for _, id := range []string{idle.SandboxID, expiring.SandboxID, stays.SandboxID} {
			if !e.p.Has(id) {
				t.Fatalf("%s reaped before it was due", id)
			}
		}
		// The tick at 30 s takes the idle one.
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if e.p.Has(idle.SandboxID) || !e.p.Has(expiring.SandboxID) {
			t.Fatalf("at 31 s: idle there %v, expiring there %v; want gone, there", e.p.Has(idle.SandboxID), e.p.Has(expiring.SandboxID))
		}
		// The tick at 50 s, the expired one.
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if e.p.Has(expiring.SandboxID) || !e.p.Has(stays.SandboxID) {
			t.Fatalf("at 51 s: expiring there %v, ttl-0 there %v; want gone, there", e.p.Has(expiring.SandboxID), e.p.Has(stays.SandboxID))
		}
		e.svc.Close() // joins the loop: the bubble ends with no goroutine left
	})
}
