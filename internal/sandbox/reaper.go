package sandbox

import (
	"context"
	"time"
)

// reaper stops expired and idle sandboxes every ReapInterval until Close.
func (s *Service) reaper() {
	defer s.reaperWG.Done()
	t := time.NewTicker(s.opts.ReapInterval)
	defer t.Stop()
	var synced time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			if now := time.Now(); s.shared != nil && now.Sub(synced) >= syncEvery {
				ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
				if err := s.syncShared(ctx); err != nil {
					s.log.Warn("read the shared state store", "err", err)
				}
				cancel()
				synced = now
			}
			s.reap(s.opts.Clock.Now())
		}
	}
}

// reap removes every sandbox whose TTL ran out, and every live one idle for
// longer than its idle timeout, as of now. It returns how many it removed.
func (s *Service) reap(now time.Time) int {
	type victim struct {
		b   *box
		why string
	}
	var vs []victim
	s.mu.Lock()
	for _, b := range s.boxes {
		switch {
		case !b.rec.ExpiresAt.IsZero() && !now.Before(b.rec.ExpiresAt):
			vs = append(vs, victim{b, "expired"})
		case b.rec.State.Live() && b.rec.IdleTimeout > 0 && b.busy == 0 && b.holds == 0 &&
			now.Sub(b.lastActive()) >= b.rec.IdleTimeout:
			vs = append(vs, victim{b, "idle"})
		}
	}
	s.mu.Unlock()
	n := 0
	for _, v := range vs {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := s.remove(ctx, v.b, v.why)
		cancel()
		if err != nil {
			s.log.Warn("reap sandbox", "sandbox", v.b.rec.ID, "why", v.why, "err", err)
			continue
		}
		n++
	}
	return n
}
