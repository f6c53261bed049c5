package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
	"github.com/sandgate/sandgate/internal/providers/providertest"
	"github.com/sandgate/sandgate/internal/testkit/terminals"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(leakCheckedM{m})
}

// leakCheckedM fails the run if it leaves sandbox inits or cgroups behind:
// sandboxes outlive the provider by design, so a missed cleanup would
// otherwise go unnoticed. It counts only this binary's sandboxes (ids from
// providertest.NewID), since other packages' tests run at the same time.
type leakCheckedM struct{ m *testing.M }

func (l leakCheckedM) Run() int {
	before := leftovers()
	code := l.m.Run()
	var leaked []string
	for _, s := range leftovers() {
		if !slices.Contains(before, s) {
			leaked = append(leaked, s)
		}
	}
	if code == 0 && len(leaked) > 0 {
		fmt.Fprintf(os.Stderr, "left behind: %v\n", leaked)
		return 1
	}
	return code
}

// leftovers lists live sandbox inits and sandbox cgroups on this machine.
func leftovers() []string {
	var out []string
	mine := cgroupPrefix + providertest.IDPrefix
	pids, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range pids {
		b, _ := os.ReadFile(p + "/cmdline")
		cg, _ := os.ReadFile(p + "/cgroup")
		if strings.Contains(string(b), jail.InitArg) && strings.Contains(string(cg), mine) {
			out = append(out, "init pid "+strings.TrimPrefix(p, "/proc/"))
		}
	}
	own := ownCgroups()
	for _, ctrl := range cgroupControllers {
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, ctrl, own[ctrl], mine+"*"))
		out = append(out, dirs...)
		dirs, _ = filepath.Glob(filepath.Join(cgroupRoot, ctrl, own[ctrl], pidsParent, mine+"*"))
		out = append(out, dirs...)
	}
	return out
}

// requireRoot skips when the namespace sandbox cannot work here: only off
// CI and only when not root. On CI a missing capability is a failure.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("the local provider's tests need root on CI")
	}
	t.Skip("the namespace sandbox needs root")
}

func newLocal(t testing.TB, opts Options) *Local {
	t.Helper()
	requireRoot(t)
	if opts.StateDir == "" {
		opts.StateDir = t.TempDir()
	}
	l, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t testing.TB, l *Local, spec providers.CreateSpec) string {
	t.Helper()
	if spec.ID == "" {
		spec.ID = providertest.NewID()
	}
	if spec.Workdir == "" {
		spec.Workdir = "/workspace"
	}
	spec.ReadyTimeout = 30 * time.Second
	if _, err := l.Create(ctxT(t), spec); err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Delete(context.Background(), spec.ID); err != nil && !errors.Is(err, providers.ErrNotFound) {
			t.Errorf("Delete: %v", err)
		}
	})
	return spec.ID
}

func sh(t testing.TB, l *Local, id, cmd string) (string, int) {
	t.Helper()
	res, err := l.Exec(ctxT(t), id, providers.ExecRequest{Command: cmd, Timeout: 30 * time.Second, MaxOutput: 1 << 20})
	if err != nil {
		t.Fatalf("Exec %q: %v", cmd, err)
	}
	return string(res.Stdout) + string(res.Stderr), res.ExitCode
}

// TestConformance and TestTerminals, the two suites, run side by
// side (each on a provider of its own) once the serial tests are done.
func TestConformance(t *testing.T) {
	t.Parallel()
	providertest.Run(t, newLocal(t, Options{}), providers.CreateSpec{})
}

// TestTerminals: the terminal-session suite through the gateway's stack,
// sessions held by the sandboxes' init.
func TestTerminals(t *testing.T) {
	t.Parallel()
	terminals.Run(t, newLocal(t, Options{}), nil)
}

func TestNamespaceIsolation(t *testing.T) {
	// A state directory outside /tmp, so that only hiding keeps it out of
	// the sandbox's view (under /tmp the private tmpfs would).
	stateDir, err := os.MkdirTemp("/var/tmp", "sandgate-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stateDir) })
	l := newLocal(t, Options{StateDir: stateDir})
	id := create(t, l, providers.CreateSpec{})

	// Registered after create's cleanup, so it runs first: the host
	// directory must still exist while the sandbox is deleted.
	hostDir, err := os.MkdirTemp("/var/tmp", "sandgate-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	hostFile := filepath.Join(hostDir, "file")
	if err := os.WriteFile(hostFile, []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tmpFile := filepath.Join(t.TempDir(), "in-host-tmp")
	if err := os.WriteFile(tmpFile, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	checks := []struct {
		name, cmd, want string
	}{
		{"hostname", "hostname", "sandbox\n"},
		{"only lo", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", "lo\n"},
		{"host files outside the view invisible", "cat " + hostFile + " 2>/dev/null || echo absent", "absent\n"},
		{"etc is copy-on-write", "echo 127.0.0.9 sandgate-test >> /etc/hosts && grep -c sandgate-test /etc/hosts", "1\n"},
		{"new files in the root", "mkdir -p /opt2/x /var/lib/y && touch /etc/sandgate-test /opt2/x/f && echo ok", "ok\n"},
		{"/usr read-only", "touch /usr/lib/sandgate-test 2>/dev/null || echo refused", "refused\n"},
		{"root-owned image", "stat -c %u:%g /usr/bin /etc/passwd /", "0:0\n0:0\n0:0\n"},
		{"tools of the host", "bash -c 'echo $BASH_VERSINFO' >/dev/null && python3 -c 'print(1+1)'", "2\n"},
		{"private /tmp", "ls " + tmpFile + " 2>/dev/null; echo $?", "2\n"},
		{"state dir hidden", "test -e " + stateDir + " || echo absent", "absent\n"},
		{"pid 1 is init", "cat /proc/1/comm", "exe\n"},
		{"no CAP_SYS_ADMIN", "umount /tmp 2>/dev/null || echo refused", "refused\n"},
		{"no mounting", "mount -t tmpfs x /mnt 2>/dev/null || echo refused", "refused\n"},
		{"/proc/sys read-only", "(echo 1 > /proc/sys/vm/drop_caches) 2>/dev/null || echo refused", "refused\n"},
		{"sysrq read-only", "(echo h > /proc/sysrq-trigger) 2>/dev/null || echo refused", "refused\n"},
		{"ptmx", "test -c /dev/pts/ptmx && test -L /dev/ptmx && test -c /dev/null && echo ok", "ok\n"},
	}
	for _, c := range checks {
		if got, _ := sh(t, l, id, c.cmd); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if b, err := os.ReadFile(hostFile); err != nil || string(b) != "host\n" {
		t.Errorf("host file after sandbox writes: %q %v", b, err)
	}
	if b, _ := os.ReadFile("/etc/hosts"); strings.Contains(string(b), "sandgate-test") {
		t.Errorf("a sandbox write reached the host's /etc/hosts")
	}
	for _, p := range []string{"/usr/lib/sandgate-test", "/etc/sandgate-test", "/opt2"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s reached the host", p)
			os.RemoveAll(p)
		}
	}

	// Init survives the signals a Go program would die of by default.
	sh(t, l, id, "kill -TERM 1; kill -HUP 1; kill -INT 1; kill -QUIT 1; kill -USR1 1; true")
	if got, code := sh(t, l, id, "echo alive"); got != "alive\n" || code != 0 {
		t.Errorf("after signalling init: %q %d", got, code)
	}
}

func TestAdoptionAfterRestart(t *testing.T) {
	stateDir := t.TempDir()
	l1 := newLocal(t, Options{StateDir: stateDir})
	id := create(t, l1, providers.CreateSpec{Env: map[string]string{"FROM_CREATE": "yes"}})
	res, err := l1.Exec(ctxT(t), id, providers.ExecRequest{
		Command: "sleep 3131.5 >/dev/null 2>&1 & echo started", Timeout: 30 * time.Second, MaxOutput: 1024, PreserveBackground: true,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("start background: %v %+v", err, res)
	}
	l1.Close()

	l2 := newLocal(t, Options{StateDir: stateDir})
	owned, err := l2.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(owned) != 1 || owned[0].ID != id || owned[0].State != providers.StateRunning {
		t.Fatalf("List after restart: %+v", owned)
	}
	if got, _ := sh(t, l2, id, "echo $FROM_CREATE; pgrep -fc 'slee[p] 3131.5' || true"); got != "yes\n1\n" {
		t.Errorf("exec through the new provider: %q", got)
	}
	l2.WriteFile(ctxT(t), id, "/workspace/adopted", strings.NewReader("ok"))
	if got, _ := sh(t, l2, id, "cat /workspace/adopted"); got != "ok" {
		t.Errorf("file through the new provider: %q", got)
	}

	// An init killed from outside (as the kernel's OOM killer would) means
	// a sandbox in error that says so, also for the provider that adopted it.
	st, err := readState(filepath.Join(stateDir, "sandboxes", id))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(st.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitState(t, l2, id, providers.StateError)
	if why := l2.StateReason(id); why != "init killed by signal SIGKILL" {
		t.Errorf("StateReason after killing init: %q", why)
	}
	if _, err := l2.Exec(ctxT(t), id, providers.ExecRequest{Command: "true", Timeout: time.Second, MaxOutput: 1}); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Exec in a stopped sandbox: %v, want ErrConflict", err)
	}
	if err := l2.Delete(ctxT(t), id); err != nil {
		t.Errorf("Delete of a stopped sandbox: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(stateDir, "sandboxes")); len(entries) != 0 {
		t.Errorf("state dir after delete: %v", entries)
	}
}

func TestResourceLimits(t *testing.T) {
	l := newLocal(t, Options{})
	mem, cpu := int64(64), 0.5
	id := create(t, l, providers.CreateSpec{Resources: providers.Resources{MemoryMiB: &mem, CPU: &cpu}})
	sb, err := l.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	for ctrl, want := range map[string][2]string{
		"memory": {"memory.limit_in_bytes", strconv.Itoa(64 << 20)},
		"cpu":    {"cpu.cfs_quota_us", "50000"},
		"pids":   {"pids.max", strconv.FormatInt(l.pidsMax, 10)},
	} {
		dir := sb.st.Cgroups[ctrl]
		if dir == "" {
			t.Errorf("no %s cgroup", ctrl)
			continue
		}
		b, err := os.ReadFile(dir + "/" + want[0])
		if got := strings.TrimSpace(string(b)); err != nil || got != want[1] {
			t.Errorf("%s: %q %v, want %s", want[0], got, err, want[1])
		}
	}
	// Init's forker thread alone is in the sandbox's pids cgroup (it
	// joined itself: see jail.Config.PidsFD), so every command is, and
	// init's other threads are not.
	c, err := l.Agent(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	forker, err := hostTid(sb.st.Pid, c.Forker())
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(sb.st.Cgroups["pids"] + "/tasks"); err != nil || !slices.Contains(strings.Fields(string(b)), strconv.Itoa(forker)) {
		t.Errorf("the sandbox's pids cgroup holds %q (%v), want init's forker thread %d", b, err, forker)
	} else if slices.Contains(strings.Fields(string(b)), strconv.Itoa(sb.st.Pid)) {
		t.Errorf("init's main thread %d is in the sandbox's pids cgroup: %q", sb.st.Pid, b)
	}
	if got, _ := sh(t, l, id, "grep -c ':pids:/.' /proc/self/cgroup; grep -c ':pids:/$' /proc/1/cgroup"); got != "1\n1\n" {
		t.Errorf("a command's pids cgroup below the namespace's root, init's at it: %q", got)
	}
	// A command is the OOM killer's first choice, ahead of init:
	// allocating past the limit gets the command OOM-killed, never init
	// (which this race-instrumented test binary makes big), and the
	// sandbox lives on.
	// Init is read from the host once the command is done: init raises
	// its score around each fork, and a command that reads init's as it
	// starts (cat, which runs without a shell) can see that instant.
	if got, _ := sh(t, l, id, "cat /proc/self/oom_score_adj"); got != "1000\n" {
		t.Errorf("oom_score_adj of a command: %q, want 1000", got)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", sb.st.Pid)); err != nil || string(b) != "0\n" {
		t.Errorf("oom_score_adj of init: %q (%v), want 0", b, err)
	}
	out, code := sh(t, l, id, `perl -e '$x = "a" x (512 * 1024 * 1024); print length($x)'`)
	if code != 137 || !strings.Contains(out, "out of memory (the sandbox's memory limit is 64 MiB)") {
		t.Errorf("512 MiB under a 64 MiB limit: exit %d %q, want 137 and the reason", code, out)
	}
	// A durable command's record says so too.
	if _, err := c.StartCommand(ctxT(t), agentclient.CommandRequest{ID: "oom", Retain: time.Minute, ExecRequest: providers.ExecRequest{
		Command: `perl -e '$x = "a" x (512 * 1024 * 1024)'`, Timeout: time.Minute, MaxOutput: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	if end, err := c.WaitCommand(ctxT(t), "oom", time.Minute); err != nil || end.Running || *end.ExitCode != 137 || !end.OOMKilled {
		t.Errorf("a durable command past the limit: %+v %v, want 137 and oom_killed", end, err)
	}
	if got, _ := sh(t, l, id, "echo alive"); got != "alive\n" {
		t.Errorf("after OOM: %q", got)
	}
}

func TestCreateFailureLeavesNothing(t *testing.T) {
	stateDir := t.TempDir()
	l := newLocal(t, Options{StateDir: stateDir})
	id := providertest.NewID()
	_, err := l.Create(ctxT(t), providers.CreateSpec{ID: id, Workdir: "/workspace", ReadyTimeout: time.Microsecond})
	if err == nil {
		t.Fatal("Create with a 1µs ready timeout succeeded")
	}
	if entries, _ := os.ReadDir(filepath.Join(stateDir, "sandboxes")); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
	for _, ctrl := range cgroupControllers {
		own := ownCgroups()[ctrl]
		for _, p := range []string{filepath.Join(cgroupRoot, ctrl, own, cgroupPrefix+id), filepath.Join(cgroupRoot, ctrl, own, pidsParent, cgroupPrefix+id)} {
			if _, err := os.Stat(p); err == nil {
				t.Errorf("%s cgroup left behind", ctrl)
			}
		}
	}
	if _, err := l.Status(ctxT(t), id); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Status of the failed sandbox: %v", err)
	}
	if strings.Contains(providers.Message(err), stateDir) {
		t.Errorf("client message names a host path: %q", providers.Message(err))
	}
}

func TestIsolationNone(t *testing.T) {
	stateDir := t.TempDir()
	l := newLocal(t, Options{StateDir: stateDir, Isolation: IsolationNone})
	id := providertest.NewID()
	sb, err := l.Create(ctxT(t), providers.CreateSpec{ID: id, Workdir: "/workspace", ReadyTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Extra["isolation"] != IsolationNone {
		t.Errorf("Extra: %v", sb.Extra)
	}
	if _, err := l.WriteFile(ctxT(t), id, "/workspace/f.txt", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	got, code := sh(t, l, id, "cat f.txt; echo; echo err >&2; exit 4")
	if got != "hello\nerr\n" || code != 4 {
		t.Errorf("exec: %q %d", got, code)
	}
	res, err := l.Exec(ctxT(t), id, providers.ExecRequest{Command: "sleep 100", Timeout: 500 * time.Millisecond, MaxOutput: 1})
	if err != nil || !res.TimedOut || res.ExitCode != 125 {
		t.Errorf("timeout: %+v %v", res, err)
	}
	if _, err := l.Exec(ctxT(t), id, providers.ExecRequest{Command: "true", Cwd: "/nope", Timeout: time.Second, MaxOutput: 1}); err == nil || strings.Contains(providers.Message(err), stateDir) {
		t.Errorf("missing cwd: %v", err)
	}
	// A preserved background process dies with the sandbox.
	res, err = l.Exec(ctxT(t), id, providers.ExecRequest{Command: "sleep 3232.5 >/dev/null 2>&1 & echo $!", Timeout: 10 * time.Second, MaxOutput: 64, PreserveBackground: true})
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		t.Fatalf("background pid %q not running", res.Stdout)
	}
	if err := l.Delete(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := procfs.ReadStat("/proc", pid)
		if err != nil || st.State == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("background process %d survived Delete", pid)
		}
		<-time.After(20 * time.Millisecond)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	if _, err := New(Options{StateDir: t.TempDir(), Isolation: "chroot"}); err == nil {
		t.Error("unknown isolation accepted")
	}
	if _, err := New(Options{}); err == nil {
		t.Error("empty state dir accepted")
	}
}

func BenchmarkExecTrue(b *testing.B) {
	l := newLocal(b, Options{})
	id := create(b, l, providers.CreateSpec{})
	ctx := context.Background()
	req := providers.ExecRequest{Command: "true", Timeout: 10 * time.Second, MaxOutput: 1024}
	for b.Loop() {
		res, err := l.Exec(ctx, id, req)
		if err != nil || res.ExitCode != 0 {
			b.Fatal(err, res.ExitCode)
		}
	}
}

// BenchmarkDirectTrue is the baseline: the same command started directly
// on the host, without namespaces or the agent.
func BenchmarkDirectTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirectBashTrue is the baseline with the shell Exec runs.
func BenchmarkDirectBashTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/bash", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateDelete(b *testing.B) {
	l := newLocal(b, Options{})
	ctx := context.Background()
	for b.Loop() {
		id := providertest.NewID()
		if _, err := l.Create(ctx, providers.CreateSpec{ID: id, Workdir: "/workspace", ReadyTimeout: 30 * time.Second}); err != nil {
			b.Fatal(err)
		}
		if err := l.Delete(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPauseWithoutFreezer covers the fallback: SIGSTOP to every process
// of the sandbox from inside its pid namespace.
func TestPauseWithoutFreezer(t *testing.T) {
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{})
	sb, err := l.lookup(id)
	if err != nil {
		t.Fatal(err)
	}
	fz := sb.st.Cgroups["freezer"]
	sb.st.Cgroups = maps.Clone(sb.st.Cgroups)
	delete(sb.st.Cgroups, "freezer")
	// Runs before create's cleanup: Delete then removes the freezer cgroup.
	t.Cleanup(func() { sb.st.Cgroups["freezer"] = fz })

	res, err := l.Exec(ctxT(t), id, providers.ExecRequest{
		Command: "sleep 3333.5 >/dev/null 2>&1 & echo $!", Timeout: 10 * time.Second, MaxOutput: 64, PreserveBackground: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	inner := strings.TrimSpace(string(res.Stdout))
	if err := l.Pause(ctxT(t), id); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if s, _ := l.Status(ctxT(t), id); s != providers.StatePaused {
		t.Errorf("Status: %s", s)
	}
	if _, err := l.Exec(ctxT(t), id, providers.ExecRequest{Command: "true", Timeout: time.Second, MaxOutput: 1}); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Exec while paused: %v", err)
	}
	if err := l.Resume(ctxT(t), id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	// The background sleep was stopped and is running again.
	if got, _ := sh(t, l, id, "cut -d' ' -f3 /proc/"+inner+"/stat"); got != "S\n" {
		t.Errorf("sleep state after resume: %q", got)
	}
}

// TestFilesStream checks that files pass through in bounded memory.
func TestFilesStream(t *testing.T) {
	// Serial: what it counts is the test binary's allocations, every test's.
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{})
	const size = 256 << 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	n, err := l.WriteFile(ctxT(t), id, "/workspace/big", io.LimitReader(zeroReader{}, size))
	if err != nil || n != size {
		t.Fatalf("WriteFile: %d %v", n, err)
	}
	rc, got, err := l.ReadFile(ctxT(t), id, "/workspace/big")
	if err != nil || got != size {
		t.Fatalf("ReadFile: %d %v", got, err)
	}
	copied, err := io.CopyBuffer(io.Discard, rc, make([]byte, 64<<10))
	rc.Close()
	if err != nil || copied != size {
		t.Fatalf("read back %d %v", copied, err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("moving 2×256 MiB allocated %d MiB", alloc>>20)
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestEntrypoint(t *testing.T) {
	t.Parallel()
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{Entrypoint: []string{"sleep", "3535.5"}})
	if got, _ := sh(t, l, id, "pgrep -fc 'slee[p] 3535.5'"); got != "1\n" {
		t.Errorf("entrypoint processes: %q", got)
	}
	_, err := l.Create(ctxT(t), providers.CreateSpec{ID: providertest.NewID(), Workdir: "/w", Entrypoint: []string{"no-such-binary-sandgate"}, ReadyTimeout: 30 * time.Second})
	if !errors.Is(err, providers.ErrInvalid) {
		t.Errorf("missing entrypoint binary: %v, want ErrInvalid", err)
	}
}

// TestSignalsStayInside: a terminal's signal goes to its foreground group
// as the agent finds it inside the sandbox, never to a process group
// number on the host. Here the foreground group is left stale (its only
// member exited): a storm of signals then reaches nobody, neither a host
// process of the test's own in a group of its own nor the sandbox's
// background process; with a live foreground group the signal lands.
func TestSignalsStayInside(t *testing.T) {
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{})
	victim := exec.Command("sleep", "120")
	victim.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	victimDone := make(chan error, 1)
	go func() { victimDone <- victim.Wait() }()
	t.Cleanup(func() { victim.Process.Kill(); <-victimDone })

	// The child takes the terminal's foreground and exits; the parent,
	// now in the background, waits on in silence.
	script := `import os, sys, time
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    time.sleep(0.3)
    os._exit(0)
os.setpgid(pid, pid)
os.tcsetpgrp(0, pid)
os.waitpid(pid, 0)
os.write(1, b"stale-ready\n")
time.sleep(120)  # stale-marker
`
	if _, err := l.WriteFile(ctxT(t), id, "/workspace/stale.py", strings.NewReader(script)); err != nil {
		t.Fatal(err)
	}
	c, err := l.Agent(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	p := startSession(t, c, "stale", "exec python3 /workspace/stale.py")
	var out bytes.Buffer
	for !strings.Contains(out.String(), "stale-ready") {
		ev, err := p.Next()
		if err != nil || ev.Exited {
			t.Fatalf("reading the terminal: %v %+v (%q)", err, ev, out.String())
		}
		out.Write(ev.Data)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP, syscall.SIGKILL} {
		if err := p.Signal(sig); err != nil {
			t.Fatalf("signal %v: %v", sig, err)
		}
	}
	if got, _ := sh(t, l, id, "ps -eo args | grep -c '[s]tale.py'"); got != "1\n" {
		t.Errorf("the background process after signals to a stale foreground group: %q", got)
	}
	select {
	case err := <-victimDone:
		t.Fatalf("the host process died: %v", err)
	default:
	}
	if err := victim.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the host process is gone: %v", err)
	}

	// A shell's foreground command gets the keyboard's signal.
	sh2 := startSession(t, c, "sh2", "sleep 100; echo interrupted-$?")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := sh(t, l, id, "ps -eo args | grep -c '^[s]leep 100'"); got == "1\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sleep never started")
		}
	}
	if err := sh2.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := sh2.Next()
		if err != nil {
			t.Fatalf("after SIGINT to the foreground: %v", err)
		}
		if ev.Exited {
			if ev.Code == 0 {
				t.Errorf("after SIGINT to the foreground: exit %d", ev.Code)
			}
			break
		}
	}
}

// startSession starts a terminal session running command on c and
// attaches to it; the session is deleted at the test's end.
func startSession(t *testing.T, c *agentclient.Client, id, command string) *agentclient.Attachment {
	t.Helper()
	if _, err := c.StartSession(ctxT(t), id, providers.ProcessSpec{Command: command, TTY: true}, false, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSession(context.Background(), id) })
	a, err := c.Attach(ctxT(t), id, 0, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestExecUsage: an exec reports what its command used, measured inside
// the sandbox: CPU time, peak memory, how long it ran, and whether it was
// killed for want of memory.
func TestExecUsage(t *testing.T) {
	t.Parallel()
	l := newLocal(t, Options{})
	mem := int64(256)
	id := create(t, l, providers.CreateSpec{Resources: providers.Resources{MemoryMiB: &mem}})
	run := func(cmd string) providers.ExecResult {
		t.Helper()
		res, err := l.Exec(ctxT(t), id, providers.ExecRequest{Command: cmd, Timeout: 30 * time.Second, MaxOutput: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.Usage == nil {
			t.Fatalf("%q: no usage", cmd)
		}
		return res
	}
	// 100 MiB touched and 0.3 s of CPU, in a child the shell waits for.
	res := run(`python3 -c '
import time
x = bytearray(100 << 20)
t = time.process_time()
while time.process_time() - t < 0.3: pass
'; true`)
	if u := res.Usage; u.PeakMemory < 100<<20 || u.PeakMemory > 200<<20 || u.CPUTime < 300*time.Millisecond || u.OOMKilled {
		t.Errorf("usage %+v", *u)
	}
	if res.Duration < 300*time.Millisecond || res.Duration > 10*time.Second {
		t.Errorf("duration %v", res.Duration)
	}
	if u := run("true").Usage; u.CPUTime > 100*time.Millisecond || u.PeakMemory > 64<<20 {
		t.Errorf("true: %+v", *u)
	}
	res = run(`python3 -c 'x = bytearray(512 << 20)'`)
	if res.ExitCode != 137 || !res.Usage.OOMKilled {
		t.Errorf("512 MiB under 256: exit %d usage %+v", res.ExitCode, *res.Usage)
	}
}

// waitState polls id's status until it is want (20 s at most).
func waitState(t *testing.T, l *Local, id string, want providers.State) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, err := l.Status(ctxT(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if s == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %s after 20 s, want %s", s, want)
		}
		<-time.After(20 * time.Millisecond)
	}
}

// TestInitKilledBySignal: sandbox root sending SIGSEGV to init (which ends
// the sandbox) leaves it in error with the signal named, not stopped; the
// sandbox then takes no command and is deleted as any other. A sandbox
// deleted while running is gone (not error), and an init's exit that is
// no signal is worded as an exit.
func TestInitKilledBySignal(t *testing.T) {
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{})
	// The command dies with the sandbox: its result does not matter.
	l.Exec(ctxT(t), id, providers.ExecRequest{Command: "kill -SEGV 1; sleep 30", Timeout: 60 * time.Second, MaxOutput: 1 << 10})
	waitState(t, l, id, providers.StateError)
	if why := l.StateReason(id); why != "init killed by signal SIGSEGV" {
		t.Errorf("StateReason: %q", why)
	}
	owned, err := l.List(ctxT(t))
	if err != nil || len(owned) != 1 || owned[0].State != providers.StateError {
		t.Errorf("List: %+v %v", owned, err)
	}
	if _, err := l.Exec(ctxT(t), id, providers.ExecRequest{Command: "true", Timeout: time.Second, MaxOutput: 1}); !errors.Is(err, providers.ErrConflict) {
		t.Errorf("Exec in a sandbox whose init died: %v, want ErrConflict", err)
	}
	if err := l.Delete(ctxT(t), id); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if _, err := l.Status(ctxT(t), id); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Status after Delete: %v, want ErrNotFound", err)
	}

	id2 := create(t, l, providers.CreateSpec{})
	if err := l.Delete(ctxT(t), id2); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Status(ctxT(t), id2); !errors.Is(err, providers.ErrNotFound) {
		t.Errorf("Status after deleting a running sandbox: %v, want ErrNotFound", err)
	}
	if why := l.StateReason(id2); why != "" {
		t.Errorf("StateReason of a deleted sandbox: %q", why)
	}

	none := func() int64 { return 0 }
	for ws, want := range map[syscall.WaitStatus]string{
		2 << 8:                              "init exited with status 2",
		(jail.InitSignalExit + 11) << 8:     "init killed by signal SIGSEGV",
		(jail.InitSignalExit + 15) << 8:     "init exited with status 143", // SIGTERM is ignored, never fatal
		syscall.WaitStatus(syscall.SIGKILL): "init killed by signal SIGKILL",
	} {
		if got := describeExit(ws, none, none); got != want {
			t.Errorf("describeExit(%#x) = %q, want %q", uint32(ws), got, want)
		}
	}
	oom := describeExit(syscall.WaitStatus(syscall.SIGKILL), func() int64 { return 1 }, func() int64 { return 64 << 20 })
	if oom != "init killed by signal SIGKILL (the sandbox ran out of memory: its limit is 64 MiB)" {
		t.Errorf("describeExit of an OOM kill: %q", oom)
	}
}

// TestFileInfoInside: files/info and files/list are answered by the agent
// inside the sandbox: kernel interface filesystems are refused as reads
// are (so /proc's links, which the gateway as host root would resolve to
// host paths, are never described), a symlink's target is what readlink
// gives inside, and ordinary directories list as before.
func TestFileInfoInside(t *testing.T) {
	l := newLocal(t, Options{})
	id := create(t, l, providers.CreateSpec{})
	sh(t, l, id, "mkdir -p /workspace/d && echo x > /workspace/d/f && ln -s /var/lib/host-only/secret /workspace/d/hl && ln -s /proc/self /workspace/d/pl")
	for _, p := range []string{"/proc/1/fd", "/proc/1/exe", "/proc/self/root", "/proc/1/root/etc", "/proc", "/sys/kernel", "/dev/pts", "/workspace/d/pl/fd", "/workspace/d/pl/exe"} {
		if fi, err := l.StatFile(ctxT(t), id, p); !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("StatFile(%s): %+v %v, want ErrInvalid", p, fi, err)
		}
		if entries, _, err := l.ListDir(ctxT(t), id, p); !errors.Is(err, providers.ErrInvalid) {
			t.Errorf("ListDir(%s): %d entries %v, want ErrInvalid", p, len(entries), err)
		}
	}
	inside, _ := sh(t, l, id, "readlink /workspace/d/hl; readlink /dev/fd")
	fi, err := l.StatFile(ctxT(t), id, "/workspace/d/hl")
	if err != nil || fi.Type != providers.FileSymlink || fi.Target+"\n" != strings.SplitAfter(inside, "\n")[0] {
		t.Errorf("StatFile of a symlink to a host-only path: %+v %v, readlink inside %q", fi, err, inside)
	}
	if fi, err := l.StatFile(ctxT(t), id, "/workspace/d/pl"); err != nil || fi.Type != providers.FileSymlink || fi.Target != "/proc/self" {
		t.Errorf("StatFile of a symlink into /proc (the link itself is ours): %+v %v", fi, err)
	}
	entries, truncated, err := l.ListDir(ctxT(t), id, "/dev")
	var fd providers.FileInfo
	for _, e := range entries {
		if e.Name == "fd" {
			fd = e
		}
	}
	if err != nil || truncated || fd.Type != providers.FileSymlink || fd.Target+"\n" != strings.SplitAfter(inside, "\n")[1] {
		t.Errorf("ListDir(/dev): fd %+v, %v %v, readlink inside %q", fd, truncated, err, inside)
	}
	if entries, _, err := l.ListDir(ctxT(t), id, "/workspace/d"); err != nil || len(entries) != 3 {
		t.Errorf("ListDir of an ordinary directory: %+v %v", entries, err)
	}
	if entries, _, err := l.ListDir(ctxT(t), id, "/"); err != nil || len(entries) == 0 {
		t.Errorf("ListDir(/): %d entries %v", len(entries), err)
	}
}
