package main

import (
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLinksNothingItDoesNotRun: the agent binary is copied into every
// Docker and Kubernetes sandbox, so it links neither the gateway's HTTP
// stack nor its service, nor the image or seccomp-profile libraries, nor
// the gateway's client of the agent: a local sandbox's setup and init
// (package jail), which it also holds, take their seccomp program
// compiled from the gateway.
func TestLinksNothingItDoesNotRun(t *testing.T) {
	gateway := []string{
		"net/http",
		"github.com/coder/websocket",
		"github.com/sandgate/sandgate/internal/sandbox",
		"github.com/sandgate/sandgate/internal/handlers",
	}
	images := []string{
		"github.com/google/go-containerregistry/",
		"github.com/moby/profiles/",
	}
	for pkg, forbidden := range map[string][]string{
		"github.com/sandgate/sandgate/cmd/sandgate-agent": append(gateway, append(images,
			"github.com/sandgate/sandgate/internal/agentclient",
			"github.com/sandgate/sandgate/internal/providers/local",
			"github.com/sandgate/sandgate/internal/seccomp")...),
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			for _, f := range forbidden {
				if dep == f || strings.HasSuffix(f, "/") && strings.HasPrefix(dep, f) {
					t.Errorf("%s links %s", pkg, dep)
				}
			}
		}
	}
}
