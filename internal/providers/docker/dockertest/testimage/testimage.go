// Package testimage builds the docker test image from the host's static
// busybox. It does not import testing, so the bench harness can use it;
// tests reach it through dockertest.
package testimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/docker/docker/api/types/build"
	"github.com/docker/docker/client"
)

// Ref is the test image: FROM scratch with Debian's static busybox
// (from busybox-static), its applets, a /tmp, and the users root and
// nobody.
const Ref = "sandgate-test/busybox:1"

// Busybox is the host's static busybox, the image's /bin/busybox.
const Busybox = "/bin/busybox"

const dockerfile = `FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/sh", "-c", "mkdir -p /tmp /root /etc /var/www && chmod 1777 /tmp && printf 'root:x:0:0:root:/root:/bin/sh\\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\\n' > /etc/passwd && printf 'root:x:0:\\nnogroup:x:65534:\\n' > /etc/group"]
`

// Ensure builds Ref on cli's daemon unless it is there (no
// registry: FROM scratch and the host's static busybox).
func Ensure(ctx context.Context, cli *client.Client) error {
	if _, err := cli.ImageInspect(ctx, Ref); err == nil {
		return nil
	}
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return errors.New("building the test image needs " + Busybox + " from busybox-static")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{{"Dockerfile", 0o644, []byte(dockerfile)}, {"busybox", 0o755, bb}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	resp, err := cli.ImageBuild(ctx, &buf, build.ImageBuildOptions{Tags: []string{Ref}, Remove: true, ForceRemove: true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if _, err := cli.ImageInspect(ctx, Ref); err != nil {
		return fmt.Errorf("building %s failed: %s", Ref, out)
	}
	return nil
}
