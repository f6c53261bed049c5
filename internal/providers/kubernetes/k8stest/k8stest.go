// Package k8stest is test support for the kubernetes provider: the test
// cluster (scripts/k8s/up.sh starts it), the images its tests run (made
// here from files and imported into the cluster's containerd: no
// registry), and clean-up by instance label.
//
// Outside CI a test that needs the cluster skips when none answers; with
// CI=true it fails.
package k8stest

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandgate/sandgate/internal/testkit"
)

// ImageRef is the test image: Debian's static busybox with its applets,
// /tmp, and the users root and nobody (as dockertest's).
const ImageRef = "sandgate-test/busybox:1"

// LabelInstance is the kubernetes provider's instance label.
const LabelInstance = "sandgate.instance"

// Namespace is where the tests' sandboxes live.
const Namespace = "default"

// work is the test cluster's directory (scripts/k8s/up.sh's K8S_WORK).
func work() string {
	if w := os.Getenv("K8S_WORK"); w != "" {
		return w
	}
	return "/var/tmp/sandgate-k8s"
}

// Kubeconfig is the test cluster's admin kubeconfig.
func Kubeconfig() string {
	if k := os.Getenv("SANDGATE_TEST_KUBECONFIG"); k != "" {
		return k
	}
	return filepath.Join(work(), "cluster/pki/admin.kubeconfig")
}

func containerdSocket() string {
	return filepath.Join(work(), "cluster/containerd/containerd.sock")
}

var (
	setupOnce  sync.Once
	setupErr   error
	agentImage string
)

// Require skips the test (outside CI) or fails it (CI=true) when the test
// cluster does not answer or the images cannot be imported. The first
// call in a process checks the cluster and imports ImageRef and the
// agent's image; later calls reuse the outcome.
func Require(t testing.TB) {
	t.Helper()
	setupOnce.Do(func() { setupErr = setup() })
	testkit.Need(t, "the test cluster (scripts/k8s/up.sh starts it)", setupErr)
}

// AgentImage is Require, then the agent image's reference.
func AgentImage(t testing.TB) string {
	t.Helper()
	Require(t)
	return agentImage
}

// RestConfig is the test cluster's admin configuration, its certificates
// read in (client-go reloads certificate files on goroutines that live as
// long as the process; the leak checks would see them).
func RestConfig(t testing.TB) *rest.Config {
	t.Helper()
	cfg, err := restConfig()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func restConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", Kubeconfig())
	if err != nil {
		return nil, err
	}
	if err := rest.LoadTLSFiles(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Client returns a client of the test cluster whose connections are
// closed when t ends.
func Client(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, done, err := client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(done)
	return cs
}

// client returns a client of the test cluster, and a func that closes its
// idle connections.
func client() (kubernetes.Interface, func(), error) {
	cfg, err := restConfig()
	if err != nil {
		return nil, nil, err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, nil, err
	}
	return cs, func() { utilnet.CloseIdleConnectionsFor(hc.Transport) }, nil
}

func setup() error {
	cs, done, err := client()
	if err != nil {
		return err
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := cs.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		return err
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("the test image needs /bin/busybox from busybox-static: %w", err)
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return err
	}
	bbFiles := []file{
		{name: "bin/", mode: 0o755},
		{name: "bin/busybox", mode: 0o755, data: bb},
		{name: "tmp/", mode: 0o1777},
		{name: "root/", mode: 0o700},
		{name: "var/", mode: 0o755},
		{name: "var/www/", mode: 0o755},
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			bbFiles = append(bbFiles, file{name: "bin/" + applet, link: "busybox"})
		}
	}
	if err := importImage(ctx, ImageRef, bbFiles, []string{"sh"}); err != nil {
		return err
	}
	// The agent's image holds the agent and the pods' egress point.
	var files []file
	h := sha256.New()
	for _, b := range []string{"sandgate-agent", "sandgate-egress"} {
		path, err := testkit.Build("cmd/"+b, b, "")
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h.Write(data)
		files = append(files, file{name: b, mode: 0o755, data: data})
	}
	agentImage = "sandgate.local/sandgate-agent:" + hex.EncodeToString(h.Sum(nil))[:16]
	return importImage(ctx, agentImage, files, []string{"/sandgate-agent", "version"})
}

// file is one entry of an image's only layer: a directory (name ends in
// /), a symlink (link), or a regular file.
type file struct {
	name string
	mode int64
	data []byte
	link string
}

// importImage writes a docker-archive (docker save) of one layer holding
// files and imports it into the test cluster's containerd.
func importImage(ctx context.Context, ref string, files []file, cmd []string) error {
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	mtime := time.Unix(1767225600, 0)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: mtime, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		switch {
		case strings.HasSuffix(f.name, "/"):
			h.Typeflag, h.Size = tar.TypeDir, 0
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode, h.Size = tar.TypeSymlink, f.link, 0o777, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	lsum := sha256.Sum256(layer.Bytes())
	lhex := hex.EncodeToString(lsum[:])
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux", "created": mtime.UTC().Format(time.RFC3339),
		"config": map[string]any{"Env": []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, "Cmd": cmd, "WorkingDir": "/"},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + lhex}},
	})
	csum := sha256.Sum256(config)
	chex := hex.EncodeToString(csum[:])
	manifest, _ := json.Marshal([]map[string]any{{"Config": chex + ".json", "RepoTags": []string{ref}, "Layers": []string{lhex + "/layer.tar"}}})

	archive, err := os.CreateTemp("", "sandgate-image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(archive.Name())
	aw := tar.NewWriter(archive)
	for _, e := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {chex + ".json", config}, {lhex + "/layer.tar", layer.Bytes()}} {
		if err := aw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: mtime}); err != nil {
			return err
		}
		if _, err := aw.Write(e.data); err != nil {
			return err
		}
	}
	if err := aw.Close(); err != nil {
		return err
	}
	if err := archive.Close(); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "ctr", "-a", containerdSocket(), "-n", "k8s.io", "images", "import", archive.Name()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import %s: %v: %s", ref, err, out)
	}
	return nil
}

// RemoveInstance deletes every pod, record (ConfigMap) and NetworkPolicy
// labelled with the given gateway instance id, reporting failures with
// t.Errorf. Meant for t.Cleanup: sandboxes outlive their gateway by
// design, not the test.
func RemoveInstance(t testing.TB, instance string) {
	t.Helper()
	cs, done, err := client()
	if err != nil {
		t.Errorf("remove pods of %s: %v", instance, err)
		return
	}
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	zero := int64(0)
	sel := metav1.ListOptions{LabelSelector: LabelInstance + "=" + instance}
	if err := cs.CoreV1().Pods(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, sel); err != nil {
		t.Errorf("remove pods of %s: %v", instance, err)
	}
	if err := cs.CoreV1().ConfigMaps(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Errorf("remove records of %s: %v", instance, err)
	}
	if err := cs.NetworkingV1().NetworkPolicies(Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		t.Errorf("remove network policies of %s: %v", instance, err)
	}
}

// DefaultRoute gives pod name (in Namespace, running) the default route
// the test cluster's bridge CNI does not give (its pods reach their
// subnet only): through the bridge's gateway, the first address of the
// pod's subnet, the host. The pod then reaches the host's other addresses
// as a real cluster's pods reach the world. The pod's network namespace
// is found by a process in the pod's cgroup.
func DefaultRoute(t testing.TB, name string) {
	t.Helper()
	cs := Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pod, err := cs.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := string(pod.UID)
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	pid := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && (bytes.Contains(b, []byte("pod"+uid)) || bytes.Contains(b, []byte("pod"+strings.ReplaceAll(uid, "-", "_")))) {
			pid, _ = strconv.Atoi(strings.Split(p, "/")[2])
			break
		}
	}
	if pid == 0 {
		t.Fatalf("no process of pod %s (uid %s) found", name, uid)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("pod %s's addresses: %v %v", name, addrs, err)
	}
	gw := addrs[0].IP.Mask(addrs[0].Mask)
	gw[len(gw)-1]++
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw}); err != nil {
		t.Fatalf("pod %s: default route via %v: %v", name, gw, err)
	}
}
