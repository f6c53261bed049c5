package docker

import (
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
)

func TestConformance(t *testing.T) {
	p := newProvider(t)
	providertest.Run(t, p, providers.CreateSpec{Image: dockertest.ImageRef})
}
