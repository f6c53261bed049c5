package main

import (
	"crypto/rand"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
)

// TestE2BSDKKubernetes: the E2B face on the kubernetes provider, through
// a part of the SDK's test file (one sandbox pod; the rest of the file
// runs on local and docker): create, commands.run, a background command
// streamed, a PTY, files, getMetrics, kill; and what a pod cannot do
// (pause, snapshots, pausing at the timeout) raises the SDK's
// SandboxError (see the README's "Using the E2B SDKs").
func TestE2BSDKKubernetes(t *testing.T) {
	t.Parallel()
	k8stest.Require(t)
	g := startK8sGateway(t, t.TempDir(), "k8se2b-"+strings.ToLower(rand.Text()[:8]), rand.Text(), "--e2b", "--api-key", e2bKey)
	runE2BSDKTests(t, g, k8stest.ImageRef, []string{
		"^create with env and metadata$",
		"^commands\\.run: stdout",
		"^a background command streams",
		"^a PTY: input",
		"^files: write, read",
		"^getMetrics",
		"^no pause:",
		"^connect gives a working handle",
	}, "E2B_TEST_NO_PAUSE=1")
}
