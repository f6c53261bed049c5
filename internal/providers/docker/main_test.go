package docker

import (
	"io"
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newProvider returns a provider with a fresh instance id, closed at the
// end of the test. It needs the daemon and the test image
// (dockertest.Require: a skip outside CI, a failure in CI).
func newProvider(t testing.TB, mod ...func(*Options)) *Docker {
	t.Helper()
	dockertest.Require(t)
	opts := Options{InstanceID: "dockertest-" + newNonce()[:8], Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AgentBinary: dockertest.AgentBinary(t)}
	for _, f := range mod {
		f(&opts)
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// The label dockertest cleans up by is the provider's.
func TestLabelsMatchDockertest(t *testing.T) {
	if LabelInstance != dockertest.LabelInstance {
		t.Fatalf("LabelInstance %q, dockertest.LabelInstance %q", LabelInstance, dockertest.LabelInstance)
	}
}
