package handlers

import (
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestHeartbeat: a beat after each full period of quiet, counted from the
// last write, first run once before the first; none while
// writes keep coming; none after end.
func TestHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := httptest.NewRecorder()
		committed := 0
		hb := startHeartbeat(newProgressWriter(rec, time.Minute), 2*time.Second, []byte("."), func() {
			committed++
		})
		ended := false
		defer func() {
			if !ended {
				hb.end()
			}
		}()
		// What was written, read under the heartbeat's lock.
		body := func() (string, int) {
			hb.mu.Lock()
			defer hb.mu.Unlock()
			return rec.Body.String(), committed
		}
		time.Sleep(time.Second) // fake time: the test's own clock
		hb.write([]byte("a"))
		time.Sleep(1500 * time.Millisecond) // 2.5 s: quiet for 1.5 s only
		synctest.Wait()
		if got, _ := body(); got != "a" {
			t.Fatalf("at 2.5 s: %q, want no beat yet", got)
		}
		time.Sleep(time.Second) // 3.5 s: quiet for 2.5 s
		synctest.Wait()
		if got, n := body(); got != "a." || n != 1 {
			t.Fatalf("at 3.5 s: %q, first ran %d times", got, n)
		}
		time.Sleep(4 * time.Second) // beats at 5 s and 7 s
		synctest.Wait()
		if got, n := body(); got != "a..." || n != 1 {
			t.Fatalf("at 7.5 s: %q, first ran %d times", got, n)
		}
		for range 5 { // writes every second: never a full period quiet
			time.Sleep(time.Second)
			hb.write([]byte("b"))
		}
		ended = true
		if !hb.end() {
			t.Fatal("end reports no beat")
		}
		time.Sleep(time.Minute)
		if got, _ := body(); got != "a..."+strings.Repeat("b", 5) {
			t.Fatalf("at the end: %q", got)
		}
	})
}
