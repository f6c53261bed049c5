package main

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

// dockerCLI runs the docker CLI (the image test drives the CLI on purpose:
// it tests the Dockerfile as a user would build and run it).
func dockerCLI(t *testing.T, stdin io.Reader, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := dockerRun(ctx, stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dockerRun runs the docker CLI and returns its trimmed output; the error
// has the output in it.
func dockerRun(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

func requireDockerCLI(t *testing.T) {
	t.Helper()
	testkit.Need(t, "a docker daemon for the image test (scripts/ci-docker.sh starts one)", exec.Command("docker", "info").Run())
}

// gatewayImage is the image TestContainerImage runs: the Dockerfile built
// by docker in the background from TestMain on, when the test is to run.
// The build compiles the gateway and its dependencies from scratch in the
// builder (minutes of CPU on two cores) while the other tests, which mostly
// wait on gateways and sandboxes, leave the CPU idle; run in turn, it was
// half of the package's time.
var gatewayImage struct {
	once   sync.Once
	cancel context.CancelFunc
	done   chan struct{} // closed when the build has ended
	tag    string
	err    error
}

// startGatewayImage starts the build once; later calls do nothing.
func startGatewayImage() {
	gatewayImage.once.Do(func() {
		// A bound that only catches a hung build: cold, under the other
		// tests' load, it takes some minutes.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		gatewayImage.cancel, gatewayImage.done = cancel, make(chan struct{})
		go func() {
			defer close(gatewayImage.done)
			gatewayImage.tag, gatewayImage.err = buildGatewayImage(ctx)
		}()
	})
}

// waitGatewayImage starts the build unless TestMain did, and returns its
// result.
func waitGatewayImage() (string, error) {
	startGatewayImage()
	<-gatewayImage.done
	return gatewayImage.tag, gatewayImage.err
}

// stopGatewayImage cancels a build still running and waits for it to end
// (TestMain, after the tests: a -skip or a failed test may leave it
// unclaimed), then removes the images it made. A no-op if it never
// started.
func stopGatewayImage() {
	if gatewayImage.done == nil {
		return
	}
	gatewayImage.cancel()
	<-gatewayImage.done
	// The builders stay (made once per Go version and go.sum); the
	// build stage (the toolchain, the source and its build: ~1.9 GB) and
	// the image would otherwise be left to each run, dangling once the
	// next run took their tags.
	exec.Command("docker", "rmi", gatewayImageTag, gatewayBuildStageTag).Run()
}

// The tags of the test's gateway image and of its Dockerfile's build
// stage, which is tagged too so that removing it removes its layers.
const (
	gatewayImageTag      = "sandgate-test/gateway:test"
	gatewayBuildStageTag = "sandgate-test/gateway-build:test"
)

// buildGatewayImage builds the Dockerfile from locally made base images
// (no registry is reachable): a builder made of this machine's Go
// toolchain and the static busybox, and scratch as the runtime.
func buildGatewayImage(ctx context.Context) (string, error) {
	builder := "sandgate-test/gobuilder:" + strings.TrimPrefix(runtime.Version(), "go")
	if exec.CommandContext(ctx, "docker", "image", "inspect", builder).Run() != nil {
		if err := importBuilder(ctx, builder); err != nil {
			return "", err
		}
	}
	ctxDir, err := os.MkdirTemp("", "sandgate-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(ctxDir)
	if err := buildContext(ctx, ctxDir); err != nil {
		return "", err
	}
	if builder, err = warmBuilder(ctx, builder, ctxDir); err != nil {
		return "", err
	}
	build := func(tag string, more ...string) error {
		args := []string{"build", "-q", "--build-arg", "BUILDER=" + builder, "--build-arg", "RUNTIME=scratch", "-t", tag}
		_, err := dockerRun(ctx, nil, append(append(args, more...), ctxDir)...)
		return err
	}
	// The build stage first, under a tag (the second build takes it from
	// the cache): untagged, it would be a dangling image after the build.
	if err := build(gatewayBuildStageTag, "--target", "build"); err != nil {
		return "", err
	}
	return gatewayImageTag, build(gatewayImageTag)
}

// TestContainerImage runs the Dockerfile's image (gatewayImage) against
// the local daemon with --provider docker and checks readiness, the
// HEALTHCHECK, and one exec in a sandbox it creates. Parallel: it waits
// for the build while the other tests run.
func TestContainerImage(t *testing.T) {
	t.Parallel()
	requireDockerCLI(t)
	sandboxImage := dockertest.Image(t)
	image, err := waitGatewayImage()
	if err != nil {
		t.Fatalf("build the image: %v", err)
	}

	var st syscall.Stat_t
	if err := syscall.Stat("/var/run/docker.sock", &st); err != nil {
		t.Fatal(err)
	}
	name := "sandgate-test-gateway-" + strings.ToLower(randomSuffix())
	dockerCLI(t, nil, "run", "-d", "--name", name,
		"-v", "/var/run/docker.sock:/var/run/docker.sock", "--group-add", strconv.Itoa(int(st.Gid)),
		"-e", "SANDGATE_API_KEYS=k-image", "-p", "127.0.0.1::8080", image)
	t.Cleanup(func() {
		exec.Command("docker", "rm", "-f", "-v", name).Run() // -v: the image's VOLUME /data
	})
	addr := dockerCLI(t, nil, "port", name, "8080/tcp")
	base := "http://" + strings.Split(addr, "\n")[0]

	testkit.EventuallyNil(t, "the gateway in its container ready", time.Minute, func() error {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			return fmt.Errorf("/readyz: %d\n%s", res.StatusCode, dockerCLI(t, nil, "logs", name))
		}
		return nil
	})
	if user := dockerCLI(t, nil, "inspect", "-f", "{{.Config.User}}", name); user != "65532:65532" {
		t.Fatalf("image runs as %q, want the non-root 65532", user)
	}

	s, b := call(t, "POST", base+"/v1/sandboxes", `{"image":"`+sandboxImage+`"}`, "Authorization", "Bearer k-image")
	if s != 201 {
		t.Fatalf("create through the containerised gateway: %d %s\n%s", s, b, dockerCLI(t, nil, "logs", name))
	}
	var ref struct {
		ID  string `json:"sandbox_id"`
		Tok string `json:"lease_token"`
	}
	json.Unmarshal(b, &ref)
	s, b = call(t, "POST", base+"/v1/sandboxes/"+ref.ID+"/exec", `{"command":"echo from-$((6*7))"}`, "X-Sandbox-Lease", ref.Tok)
	if s != 200 || !strings.Contains(string(b), `"stdout":"from-42\n"`) {
		t.Fatalf("exec: %d %s", s, b)
	}
	if s, b := call(t, "DELETE", base+"/v1/sandboxes/"+ref.ID, "", "X-Sandbox-Lease", ref.Tok); s != 200 {
		t.Fatalf("delete: %d %s", s, b)
	}

	// The daemon runs the check on its own interval (10 s).
	testkit.Eventually(t, "the HEALTHCHECK healthy", time.Minute, func() bool {
		h := dockerCLI(t, nil, "inspect", "-f", "{{.State.Health.Status}}", name)
		if h == "unhealthy" {
			t.Fatalf("HEALTHCHECK status %q", h)
		}
		return h == "healthy"
	})
}

// warmBuilder returns builder with the vendored dependencies of the build
// context ctxDir already compiled into its Go build cache, made once per
// go.sum (and kept by the daemon, as builder is): the Dockerfile's build
// stage then compiles only sandgate's own packages (cold, the
// dependencies took minutes of both cores). The flags match the
// Dockerfile's, so its build finds these cache entries.
func warmBuilder(ctx context.Context, builder, ctxDir string) (string, error) {
	sum, err := os.ReadFile(filepath.Join(ctxDir, "go.sum"))
	if err != nil {
		return "", err
	}
	// Only the cache stays: /src goes in the same layer, so no stale file
	// reaches the Dockerfile's COPY.
	dockerfile := "FROM " + builder + `
WORKDIR /src
COPY . .
RUN export CGO_ENABLED=0 && \
    go build -mod=vendor -trimpath $(go list -mod=vendor -deps -f '{{with .Module}}{{if not .Main}}{{$.ImportPath}}{{end}}{{end}}' ./cmd/gateway ./cmd/sandgate-agent) && \
    rm -rf /src
`
	h := sha256.Sum256([]byte(dockerfile + "\n" + string(sum)))
	warm := builder + "-deps-" + hex.EncodeToString(h[:6])
	if exec.CommandContext(ctx, "docker", "image", "inspect", warm).Run() == nil {
		return warm, nil
	}
	_, err = dockerRun(ctx, strings.NewReader(dockerfile), "build", "-q", "-f", "-", "-t", warm, ctxDir)
	return warm, err
}

func randomSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// importBuilder makes a builder image from this machine's Go toolchain
// and the static busybox (for RUN's /bin/sh), with docker import.
func importBuilder(ctx context.Context, tag string) error {
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("the builder image needs /bin/busybox (busybox-static): %v", err)
	}
	goroot := runtime.GOROOT()
	pr, pw := io.Pipe()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		tw := tar.NewWriter(pw)
		err := func() error {
			for _, d := range []string{"bin/", "tmp/", "root/", "usr/", "usr/local/"} {
				mode := int64(0o755)
				if d == "tmp/" {
					mode = 0o1777
				}
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: mode}); err != nil {
					return err
				}
			}
			if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))}); err != nil {
				return err
			}
			tw.Write(bb)
			for _, applet := range []string{"sh", "mkdir", "[", "test", "ls", "cat"} {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox"}); err != nil {
					return err
				}
			}
			return filepath.WalkDir(goroot, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(goroot, p)
				if d.IsDir() && (rel == "test" || rel == "doc" || rel == "misc" || rel == "api") {
					return filepath.SkipDir
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				link := ""
				if info.Mode()&fs.ModeSymlink != 0 {
					link, _ = os.Readlink(p)
				}
				h, err := tar.FileInfoHeader(info, link)
				if err != nil {
					return err
				}
				h.Name = filepath.Join("usr/local/go", rel)
				if d.IsDir() {
					h.Name += "/"
				}
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				if info.Mode().IsRegular() {
					f, err := os.Open(p)
					if err != nil {
						return err
					}
					_, err = io.Copy(tw, f)
					f.Close()
					return err
				}
				return nil
			})
		}()
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err = dockerRun(ctx, pr, "import",
		"--change", "ENV PATH=/usr/local/go/bin:/bin", "--change", "ENV HOME=/root",
		"--change", "ENV GOTOOLCHAIN=local", "--change", "ENV GOFLAGS=-buildvcs=false", "-", tag)
	pr.CloseWithError(err) // ends the writer if docker stopped reading early
	<-wrote
	return err
}

// buildContext copies the repository's tracked files (plus the web
// vendor files, if built) into dir with a vendor/ tree, so the image
// builds offline.
func buildContext(ctx context.Context, dir string) error {
	// The same context make image builds from.
	cmd := exec.CommandContext(ctx, "../../scripts/image-context.sh", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("image-context.sh: %v\n%s", err, out)
	}
	return nil
}
