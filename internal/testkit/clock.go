package testkit

import (
	"sync"
	"time"
)

// Clock is a fake clock that only moves when told to: Now returns the
// time it was set to, plus every Advance since. Safe for concurrent use.
// Code whose timers must fire is better tested in a testing/synctest
// bubble; Clock is for code that only reads the time.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
