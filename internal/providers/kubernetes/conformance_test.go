package kubernetes

import (
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit/terminals"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	providertest.Run(t, p, providers.CreateSpec{Image: k8stest.ImageRef})
}

// TestTerminals: the terminal-session suite through the gateway's stack,
// sessions held by the pods' agents.
func TestTerminals(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	terminals.Run(t, newProvider(t), map[string]any{"image": k8stest.ImageRef})
}
