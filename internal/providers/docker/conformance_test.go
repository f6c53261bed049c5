package docker

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit/terminals"
)

// transports are the ways to a sandbox's agent the suites run over, at
// once: direct (the default) and exec (the fallback).
var transports = []string{TransportDirect, TransportExec}

// withTransport runs fn for each transport in parallel, with a provider
// that uses it; on the direct path, no connection may have fallen back.
func withTransport(t *testing.T, fn func(t *testing.T, p *Docker)) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			var log fallbackLog
			p := newProvider(t, func(o *Options) {
				o.Logger = slog.New(&log)
				if tr == TransportExec {
					o.AgentTransport = TransportExec
				}
			})
			fn(t, p)
			if why := log.reasons(); tr == TransportDirect && len(why) > 0 {
				t.Errorf("%d connections fell back to exec: %q", len(why), why)
			}
		})
	}
}

// fallbackLog counts the provider's reports of a connection through exec.
type fallbackLog struct {
	mu  sync.Mutex
	why []string
}

func (l *fallbackLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *fallbackLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *fallbackLog) WithGroup(string) slog.Handler            { return l }
func (l *fallbackLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == fallbackMessage {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "reason" {
				l.mu.Lock()
				l.why = append(l.why, a.Value.String())
				l.mu.Unlock()
			}
			return true
		})
	}
	return nil
}

func (l *fallbackLog) reasons() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.why
}

func TestConformance(t *testing.T) {
	withTransport(t, func(t *testing.T, p *Docker) {
		providertest.Run(t, p, providers.CreateSpec{Image: dockertest.ImageRef})
	})
}

// TestTerminals: the terminal-session suite through the gateway's stack,
// sessions held by the containers' agents.
func TestTerminals(t *testing.T) {
	withTransport(t, func(t *testing.T, p *Docker) {
		terminals.Run(t, p, map[string]any{"image": dockertest.Image(t)})
	})
}
