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
	first func() // run under mu before the first beat (committing the status); nil: none

	mu     sync.Mutex // guards wrote, beats, failed and every write to w
	wrote  bool       // something was written since the last tick
	beats  int
	failed bool

	stop chan struct{}
	done chan struct{} // closed when the goroutine returned
}

// startHeartbeat starts beating beat onto w every period of quiet.
// first, if set, runs before the first beat. The caller must call end.
func startHeartbeat(w *progressWriter, every time.Duration, beat []byte, first func()) *heartbeat {
	h := &heartbeat{w: w, beat: beat, first: first, stop: make(chan struct{}), done: make(chan struct{})}
	go h.run(every)
	return h
}

func (h *heartbeat) run(every time.Duration) {
	defer close(h.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		h.mu.Lock()
		if !h.wrote && !h.failed {
			if h.beats == 0 && h.first != nil {
				h.first()
			}
			h.beats++
			_, err := h.w.Write(h.beat)
			if err == nil {
				err = h.w.flush()
			}
			h.failed = err != nil
		}
		h.wrote = false
		h.mu.Unlock()
	}
}

// write writes p and pushes it onto the connection.
func (h *heartbeat) write(p []byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wrote = true
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
