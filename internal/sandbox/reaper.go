package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
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
// longer than its idle timeout, as of now; an expired one that pauses on
// expiry and is running or paused is paused instead. It returns how many
// it removed.
func (s *Service) reap(now time.Time) int {
	type victim struct {
		b   *box
		why string
	}
	var vs []victim
	var pauses []*box
	s.mu.Lock()
	for _, b := range s.boxes {
		switch {
		case !b.rec.ExpiresAt.IsZero() && !now.Before(b.rec.ExpiresAt):
			if b.rec.PauseOnExpiry && (b.rec.State == providers.StateRunning || b.rec.State == providers.StatePaused) {
				pauses = append(pauses, b)
				continue
			}
			vs = append(vs, victim{b, "expired"})
		case b.rec.State.Live() && b.rec.IdleTimeout > 0 && b.busy == 0 && b.holds == 0 &&
			now.Sub(b.lastActive()) >= b.rec.IdleTimeout:
			vs = append(vs, victim{b, "idle"})
		}
	}
	s.mu.Unlock()
	for _, b := range pauses {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if err := s.pauseExpired(ctx, b); err != nil {
			// The TTL still holds: a sandbox that cannot be paused ends.
			s.log.Warn("pause expired sandbox, removing it instead", "sandbox", b.rec.ID, "err", err)
			vs = append(vs, victim{b, "expired"})
		}
		cancel()
	}
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

// pauseExpired pauses b, whose TTL ran out, and clears its expiry: a
// sandbox paused at its expiry waits, paused, until it is resumed (which
// starts a new TTL) or deleted.
func (s *Service) pauseExpired(ctx context.Context, b *box) error {
	s.mu.Lock()
	id, state := b.rec.ID, b.rec.State
	s.mu.Unlock()
	if state == providers.StateRunning {
		// Only a provider that pauses takes such a sandbox (createFor).
		if err := s.p.(providers.Pauser).Pause(ctx, id); err != nil {
			return fmt.Errorf("pause %s: %w", id, err)
		}
	}
	s.mu.Lock()
	b.rec.ExpiresAt = time.Time{}
	s.mu.Unlock()
	s.setState(ctx, b, providers.StatePaused)
	s.log.Info("sandbox paused", "sandbox", id, "why", "expired")
	return nil
}
