package handlers

import (
	"sync"
	"time"
)

// heartbeat keeps a reply that waits for its answer from looking idle to
// the proxies on its way: it writes beat whenever a period passes with
// nothing written, until end. While it runs, every other write of the
// reply goes through write (one lock orders them; none is written to the
// network under another lock). A write error stops the beats; the
// reply's own writes then fail too.
type heartbeat struct {
	w     *progressWriter
	beat  []byte
	every time.Duration
	first func() // run under mu before the first beat (committing the status); nil: none

	mu     sync.Mutex // guards last, beats, failed and every write to w
	last   time.Time  // of the last write, a beat's included
	beats  int
	failed bool

	stop chan struct{}
	done chan struct{} // closed when the goroutine returned
}

// startHeartbeat starts beating beat onto w after every period of quiet.
// first, if set, runs before the first beat. The caller must call end.
func startHeartbeat(w *progressWriter, every time.Duration, beat []byte, first func()) *heartbeat {
	h := &heartbeat{w: w, beat: beat, every: every, first: first, last: time.Now(),
		stop: make(chan struct{}), done: make(chan struct{})}
	go h.run()
	return h
}

func (h *heartbeat) run() {
	defer close(h.done)
	t := time.NewTimer(h.every)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		if h.failed {
			h.mu.Unlock()
			return
		}
		now := time.Now()
		if now.Sub(h.last) >= h.every {
			if h.beats == 0 && h.first != nil {
				h.first()
			}
			h.beats++
			_, err := h.w.Write(h.beat)
			if err == nil {
				err = h.w.flush()
			}
			h.failed = err != nil
			h.last = now
		}
		// The next beat is due a period after the last write.
		t.Reset(h.last.Add(h.every).Sub(now))
		h.mu.Unlock()
	}
}

// write writes p and pushes it onto the connection.
func (h *heartbeat) write(p []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = time.Now()
	if _, err := h.w.Write(p); err != nil {
		return err
	}
	return h.w.flush()
}

// end stops the beats and waits for the goroutine; after it the reply is
// written directly again. It reports whether a beat was written (so
// first ran).
func (h *heartbeat) end() bool {
	close(h.stop)
	<-h.done
	return h.beats > 0
}
