package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
	"go.uber.org/goleak"
)

// testImage is built at test set-up from Debian's busybox-static and
// reused while present.
const testImage = "sandgate-test/busybox:1"

// testDockerfile: busybox applets, a /tmp, and the users the conformance
// suite runs as.
const testDockerfile = `FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/sh", "-c", "mkdir -p /tmp /root /etc /var/www && chmod 1777 /tmp && printf 'root:x:0:0:root:/root:/bin/sh\\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\\n' > /etc/passwd && printf 'root:x:0:\\nnogroup:x:65534:\\n' > /etc/group"]
`

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var (
	setupOnce sync.Once
	setupErr  error
)

// requireDocker skips (outside CI) or fails (CI=true) the test when no
// daemon answers, and makes sure the test image exists.
func requireDocker(t testing.TB) {
	t.Helper()
	setupOnce.Do(func() { setupErr = setup() })
	if setupErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("docker daemon required in CI (run scripts/ci-docker.sh): %v", setupErr)
		}
		t.Skipf("no docker daemon (scripts/ci-docker.sh starts one): %v", setupErr)
	}
}

func setup() error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
	defer pcancel()
	if _, err := cli.Ping(pctx); err != nil {
		return err
	}
	if _, err := cli.ImageInspect(ctx, testImage); err == nil {
		return nil
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return errors.New("building the test image needs /bin/busybox from busybox-static")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"Dockerfile", 0o644, []byte(testDockerfile)}, {"busybox", 0o755, bb}} {
		tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))})
		tw.Write(f.data)
	}
	tw.Close()
	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{Tags: []string{testImage}, Remove: true, ForceRemove: true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if _, err := cli.ImageInspect(ctx, testImage); err != nil {
		return errors.New("image build failed: " + string(out))
	}
	return nil
}

// newProvider returns a provider with a fresh instance id, closed at the
// end of the test.
func newProvider(t testing.TB, mod ...func(*Options)) *Docker {
	t.Helper()
	requireDocker(t)
	opts := Options{InstanceID: "dockertest-" + newNonce()[:8], Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
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
