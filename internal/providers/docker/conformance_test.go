package docker

import (
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit/terminals"
)

func TestConformance(t *testing.T) {
	p := newProvider(t)
	providertest.Run(t, p, providers.CreateSpec{Image: dockertest.ImageRef})
}

// TestTerminals: the terminal-session suite through the gateway's stack,
// sessions held by the containers' agents.
func TestTerminals(t *testing.T) {
	terminals.Run(t, newProvider(t), map[string]any{"image": dockertest.Image(t)})
}
