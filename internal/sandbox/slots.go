package sandbox

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// slots is the capacity limit: at most max live sandboxes, and a FIFO
// queue of creates waiting for one. A released slot is handed straight to
// the oldest waiter, so a newcomer can never overtake the queue.
type slots struct {
	mu      sync.Mutex // guards used and waiters
	max     int
	used    int
	waiters list.List // of chan struct{}, closed when granted a slot
}

func newSlots(max int) *slots {
	return &slots{max: max}
}

// take counts a slot as used without waiting (adopted sandboxes; may go
// over max after a restart with a lower limit).
func (s *slots) take() {
	s.mu.Lock()
	s.used++
	s.mu.Unlock()
}

// waiting returns how many creates are queued.
func (s *slots) waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiters.Len()
}

// acquire takes a slot, waiting in FIFO order up to timeout. It returns
// ErrUnavailable when the wait times out, or ctx's error.
func (s *slots) acquire(ctx context.Context, timeout time.Duration) error {
	s.mu.Lock()
	if s.used < s.max && s.waiters.Len() == 0 {
		s.used++
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	el := s.waiters.PushBack(ch)
	s.mu.Unlock()

	t := time.NewTimer(timeout)
	defer t.Stop()
	var err error
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = providers.Errorf(providers.ErrUnavailable, "at capacity (%d sandboxes): waited %s for a free slot", s.max, timeout)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-ch:
		// Granted while giving up: pass the slot on.
		s.handOff()
	default:
		s.waiters.Remove(el)
	}
	return err
}

// release frees a slot, handing it to the oldest waiter if any.
func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handOff()
}

// handOff gives a used slot to the oldest waiter or frees it. s.mu held.
func (s *slots) handOff() {
	if s.used <= s.max {
		if el := s.waiters.Front(); el != nil {
			s.waiters.Remove(el)
			close(el.Value.(chan struct{}))
			return
		}
	}
	s.used--
}
