package main

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/docker/dockertest"
)

// dockerCLI runs the docker CLI (the image test drives the CLI on purpose:
// it tests the Dockerfile as a user would build and run it).
func dockerCLI(t *testing.T, stdin io.Reader, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func requireDockerCLI(t *testing.T) {
	t.Helper()
	if err := exec.Command("docker", "info").Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the image test needs a docker daemon in CI (scripts/ci-docker.sh starts one): %v", err)
		}
		t.Skipf("no docker daemon: %v", err)
	}
}

// TestContainerImage builds the Dockerfile from locally made base images
// (no registry is reachable): a builder made of this machine's Go
// toolchain and the static busybox, and scratch as the runtime. It runs
// the image against the local daemon with --provider docker and checks
// readiness, the HEALTHCHECK, and one exec in a sandbox it creates.
func TestContainerImage(t *testing.T) {
	requireDockerCLI(t)
	builder := "sandgate-test/gobuilder:" + strings.TrimPrefix(runtime.Version(), "go")
	if exec.Command("docker", "image", "inspect", builder).Run() != nil {
		importBuilder(t, builder)
	}
	sandboxImage := dockertest.Image(t)

	ctxDir := buildContext(t)
	image := "sandgate-test/gateway:test"
	dockerCLI(t, nil, "build", "-q", "--build-arg", "BUILDER="+builder, "--build-arg", "RUNTIME=scratch", "-t", image, ctxDir)

	var st syscall.Stat_t
	if err := syscall.Stat("/var/run/docker.sock", &st); err != nil {
		t.Fatal(err)
	}
	name := "sandgate-test-gateway-" + strings.ToLower(randomSuffix())
	dockerCLI(t, nil, "run", "-d", "--name", name,
		"-v", "/var/run/docker.sock:/var/run/docker.sock", "--group-add", strconv.Itoa(int(st.Gid)),
		"-e", "SANDGATE_API_KEYS=k-image", "-p", "127.0.0.1::8080", image)
	t.Cleanup(func() {
		exec.Command("docker", "rm", "-f", name).Run()
	})
	addr := dockerCLI(t, nil, "port", name, "8080/tcp")
	base := "http://" + strings.Split(addr, "\n")[0]

	deadline := time.Now().Add(60 * time.Second)
	for {
		res, err := http.Get(base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway in its container never ready (%v)\n%s", err, dockerCLI(t, nil, "logs", name))
		}
		time.Sleep(100 * time.Millisecond) // polling an external process with a deadline
	}
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

	deadline = time.Now().Add(60 * time.Second)
	for {
		h := dockerCLI(t, nil, "inspect", "-f", "{{.State.Health.Status}}", name)
		if h == "healthy" {
			break
		}
		if h == "unhealthy" || time.Now().After(deadline) {
			t.Fatalf("HEALTHCHECK status %q", h)
		}
		time.Sleep(200 * time.Millisecond) // the daemon runs the check on its own interval
	}
}

func randomSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// importBuilder makes a builder image from this machine's Go toolchain
// and the static busybox (for RUN's /bin/sh), with docker import.
func importBuilder(t *testing.T, tag string) {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("the builder image needs /bin/busybox (busybox-static): %v", err)
	}
	goroot := runtime.GOROOT()
	pr, pw := io.Pipe()
	go func() {
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
	dockerCLI(t, pr, "import",
		"--change", "ENV PATH=/usr/local/go/bin:/bin", "--change", "ENV HOME=/root",
		"--change", "ENV GOTOOLCHAIN=local", "--change", "ENV GOFLAGS=-buildvcs=false", "-", tag)
}

// buildContext copies the repository's tracked files (plus the web
// vendor files, if built) into a temp dir with a vendor/ tree, so the
// image builds offline.
func buildContext(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files, err := exec.Command("git", "-C", "../..", "ls-files", "-co", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	list := strings.Fields(string(files))
	if vendored, _ := filepath.Glob("../../web/static/vendor/*"); len(vendored) > 0 {
		for _, v := range vendored {
			list = append(list, strings.TrimPrefix(v, "../../"))
		}
	}
	for _, f := range list {
		src := filepath.Join("../..", f)
		info, err := os.Lstat(src)
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, f)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if err := os.WriteFile(dst, data, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	vendor := exec.Command("go", "mod", "vendor")
	vendor.Dir = dir
	if out, err := vendor.CombinedOutput(); err != nil {
		t.Fatalf("go mod vendor: %v\n%s", err, out)
	}
	return dir
}
