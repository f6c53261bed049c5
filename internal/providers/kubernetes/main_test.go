package kubernetes

import (
	"crypto/rand"
	"io"
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The exec WebSocket's pinger outlives its stream until its next
		// tick (client-go stops it only on a close frame from the server).
		goleak.IgnoreTopFunction("k8s.io/client-go/tools/remotecommand.(*heartbeat).start"),
	)
}

// newProvider returns a provider of the test cluster with a fresh instance
// id, closed (and its pods removed) at the end of the test. It needs the
// cluster (k8stest.Require: a skip outside CI, a failure in CI).
func newProvider(t testing.TB, mod ...func(*Options)) *Kubernetes {
	t.Helper()
	opts := Options{
		RestConfig: k8stest.RestConfig(t),
		Namespace:  k8stest.Namespace,
		InstanceID: "k8stest-" + rand.Text()[:8],
		AgentImage: k8stest.AgentImage(t),
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range mod {
		f(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		k8stest.RemoveInstance(t, opts.InstanceID)
	})
	return p
}

// The label k8stest cleans up by is the provider's.
func TestLabelsMatchK8stest(t *testing.T) {
	t.Parallel()
	if LabelInstance != k8stest.LabelInstance {
		t.Fatalf("LabelInstance %q, k8stest.LabelInstance %q", LabelInstance, k8stest.LabelInstance)
	}
}
