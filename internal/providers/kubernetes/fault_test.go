package kubernetes

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/kubernetes/k8stest"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit"
)

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func create(t testing.TB, p *Kubernetes, spec providers.CreateSpec) string {
	t.Helper()
	if spec.ID == "" {
		spec.ID = providertest.NewID()
	}
	if spec.Image == "" {
		spec.Image = k8stest.ImageRef
	}
	if spec.ReadyTimeout == 0 {
		spec.ReadyTimeout = time.Minute
	}
	if _, err := p.Create(ctxT(t, 2*time.Minute), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	return spec.ID
}

// A pod deleted behind the gateway's back: the sandbox is gone (404), and
// calls on it answer at once instead of hanging on the broken stream.
func TestPodDeletedBehindBack(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxT(t, time.Minute)
	if _, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true"}); err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := p.Exec(ctx, id, providers.ExecRequest{Command: "sleep 30", Timeout: time.Minute})
	if k := providers.Kind(err); k != providers.ErrNotFound && k != providers.ErrConflict {
		t.Fatalf("exec in a deleted pod: %v (kind %v), want not found or conflict", err, k)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("exec in a deleted pod took %v", d)
	}
	if _, err := p.Status(ctx, id); providers.Kind(err) != providers.ErrNotFound {
		t.Errorf("Status of a deleted pod: %v, want not found", err)
	}
	if err := p.Delete(ctx, id); providers.Kind(err) != providers.ErrNotFound {
		t.Errorf("Delete of a deleted pod: %v, want not found", err)
	}
}

// A pod that cannot be scheduled fails the create within its ready
// timeout, naming the pod's condition, and leaves no pod behind.
func TestUnschedulable(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	disk := 1e6 // GiB: its request (the limit) fits no node
	id := providertest.NewID()
	_, err := p.Create(ctxT(t, time.Minute), providers.CreateSpec{ID: id, Image: k8stest.ImageRef, Resources: providers.Resources{DiskGiB: &disk}, ReadyTimeout: 5 * time.Second})
	if providers.Kind(err) != providers.ErrUnavailable || !strings.Contains(err.Error(), "Unschedulable") {
		t.Fatalf("create of an unschedulable pod: %v, want unavailable naming Unschedulable", err)
	}
	if _, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctxT(t, time.Minute), id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod is still there after the failed create: %v", err)
	}
}

// An image the node does not have fails the create at once (this
// cluster has no registry), naming the image error.
func TestMissingImage(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	id := providertest.NewID()
	start := time.Now()
	_, err := p.Create(ctxT(t, 2*time.Minute), providers.CreateSpec{ID: id, Image: "sandgate-test/no-such-image:1", ReadyTimeout: time.Minute})
	if providers.Kind(err) != providers.ErrInvalid || !strings.Contains(err.Error(), "Image") {
		t.Fatalf("create with a missing image: %v, want invalid naming the image error", err)
	}
	if d := time.Since(start); d > 45*time.Second {
		t.Errorf("the create took %v to give up", d)
	}
	if _, err := k8stest.Client(t).CoreV1().Pods(k8stest.Namespace).Get(ctxT(t, time.Minute), id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod is still there after the failed create: %v", err)
	}
}

// A sandbox whose main process goes over memory_mib is in error, and its
// reason says OOMKilled.
func TestOOMKilled(t *testing.T) {
	t.Parallel()
	p := newProvider(t)
	mem := int64(64)
	// tail of an endless line holds it all: it grows until the limit.
	id := create(t, p, providers.CreateSpec{
		Resources:  providers.Resources{MemoryMiB: &mem},
		Entrypoint: []string{"/bin/sh", "-c", "sleep 2; exec tail /dev/zero"},
	})
	ctx := ctxT(t, 2*time.Minute)
	for {
		st, err := p.Status(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if st == providers.StateError {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("state %s after 2 minutes, want error", st)
		}
		poll(ctx, 200*time.Millisecond)
	}
	if why := p.StateReason(id); !strings.Contains(why, "OOMKilled") {
		t.Fatalf("reason %q, want OOMKilled", why)
	}
	if _, err := p.Exec(ctx, id, providers.ExecRequest{Command: "true"}); providers.Kind(err) != providers.ErrConflict {
		t.Errorf("exec in an OOM-killed sandbox: %v, want conflict", err)
	}
}

// The API server restarted under a live sandbox: calls fail (no hang)
// while it is down, and work again after it is back, without a new
// provider. It fails every other user of the cluster meanwhile, so it
// runs only when SANDGATE_K8S_RESTART_TEST=1, never beside other
// packages' cluster tests (make test runs it after them):
//
//	SANDGATE_K8S_RESTART_TEST=1 go test -run TestAPIServerRestart ./internal/providers/kubernetes/
func TestAPIServerRestart(t *testing.T) {
	if os.Getenv("SANDGATE_K8S_RESTART_TEST") != "1" {
		t.Skip("stops the shared cluster's API server; set SANDGATE_K8S_RESTART_TEST=1")
	}
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxT(t, 3*time.Minute)
	if _, err := p.Exec(ctx, id, providers.ExecRequest{Command: "echo hi > /tmp/before"}); err != nil {
		t.Fatal(err)
	}
	restart := stopAPIServer(t)
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	_, err := p.Exec(cctx, id, providers.ExecRequest{Command: "true", Timeout: 10 * time.Second})
	cancel()
	if err == nil {
		t.Log("an exec worked with the API server down (its stream was up)")
	} else if d := time.Since(start); d > 35*time.Second {
		t.Errorf("exec with the API server down took %v: %v", d, err)
	}
	restart()
	for {
		res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "cat /tmp/before", Timeout: 10 * time.Second})
		if err == nil {
			if string(res.Stdout) != "hi\n" {
				t.Fatalf("after the restart: %q", res.Stdout)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no exec within 3 minutes of the API server's restart: %v", err)
		}
		poll(ctx, 250*time.Millisecond)
	}
	if st, err := p.Status(ctx, id); err != nil || st != providers.StateRunning {
		t.Fatalf("after the restart: %s, %v", st, err)
	}
}

// stopAPIServer stops the test cluster's API server and returns a func
// that starts it again with the same command line and waits until it
// answers (also run at the test's end if the test did not).
func stopAPIServer(t *testing.T) (restart func()) {
	t.Helper()
	pidFile := filepath.Join(filepath.Dir(filepath.Dir(k8stest.Kubeconfig())), "pids/apiserver")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	// SIGKILL: a crash (a graceful stop waits a minute for its watchers).
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, "the API server to die", time.Minute, func() bool { return !alive(pid) })
	done := false
	restart = func() {
		if done {
			return
		}
		done = true
		log, err := os.OpenFile(filepath.Join(filepath.Dir(pidFile), "../logs/apiserver.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer log.Close()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // it outlives the test, as up.sh's did
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(pidFile, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
		cmd.Process.Release()
		cs := k8stest.Client(t)
		ctx := ctxT(t, 2*time.Minute)
		for cs.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error() != nil {
			if ctx.Err() != nil {
				t.Fatal("the API server is not back within 2 minutes")
			}
			poll(ctx, 100*time.Millisecond)
		}
	}
	t.Cleanup(restart)
	return restart
}

// alive reports whether process pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// poll waits d (or until ctx ends): the pause between two polls of a
// condition with a deadline.
func poll(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// With RunAsNonRoot every process of the sandbox is nobody, who owns its
// workdir; root's files stay out of reach.
func TestRunAsNonRoot(t *testing.T) {
	t.Parallel()
	p := newProvider(t, func(o *Options) { o.RunAsNonRoot = true })
	id := create(t, p, providers.CreateSpec{Workdir: "/work"})
	ctx := ctxT(t, time.Minute)
	res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "id -u; id -g; echo hi > note && cat note; touch /root/x 2>/dev/null || echo denied", Cwd: "/work"})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Stdout); got != "65534\n65534\nhi\ndenied\n" {
		t.Fatalf("got %q (stderr %q)", got, res.Stderr)
	}
	if _, err := p.WriteFile(ctx, id, "/work/up.txt", strings.NewReader("x")); err != nil {
		t.Fatalf("file into the workdir: %v", err)
	}
	// The agent, as nobody, cannot become root.
	if res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "id -u", User: "root"}); err == nil && res.ExitCode == 0 {
		t.Fatalf("an exec as root ran: %q", res.Stdout)
	}
}
