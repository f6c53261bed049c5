package docker

// Escape tests: each runs an attack inside a real sandbox made with the
// provider's defaults and checks that it fails or stays inside.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestEscapePrivileges: no-new-privileges and the daemon's default seccomp
// profile apply to every exec, as root and as another user, and the
// dropped capabilities are gone from the bounding set.
func TestEscapePrivileges(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	info, err := p.cli.ContainerInspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	hc := info.HostConfig
	if !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || hc.Privileged || len(hc.CapAdd) > 0 {
		t.Errorf("SecurityOpt %v privileged %v CapAdd %v", hc.SecurityOpt, hc.Privileged, hc.CapAdd)
	}
	for _, o := range hc.SecurityOpt {
		if strings.Contains(o, "unconfined") || strings.HasPrefix(o, "seccomp") {
			t.Errorf("SecurityOpt %q replaces a default profile", o)
		}
	}

	// Bits of CapBnd: SYS_ADMIN and SYS_MODULE are never in Docker's
	// default set; the rest are the provider's drops.
	banned := map[string]uint{"NET_RAW": 13, "SYS_MODULE": 16, "SYS_ADMIN": 21, "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}
	for _, user := range []string{"", "nobody"} {
		res, err := p.Exec(ctxFor(t, time.Minute), id, providers.ExecRequest{Command: "cat /proc/self/status", User: user, Timeout: 30 * time.Second, MaxOutput: 1 << 20})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("as %q: %v %+v", user, err, res)
		}
		st := procStatus(string(res.Stdout))
		if st["Seccomp"] != "2" || st["NoNewPrivs"] != "1" {
			t.Errorf("as %q: Seccomp %q NoNewPrivs %q, want 2 (filter) and 1", user, st["Seccomp"], st["NoNewPrivs"])
		}
		bnd, err := strconv.ParseUint(st["CapBnd"], 16, 64)
		if err != nil {
			t.Fatalf("CapBnd %q: %v", st["CapBnd"], err)
		}
		for name, bit := range banned {
			if bnd&(1<<bit) != 0 {
				t.Errorf("as %q: CAP_%s is in the bounding set %s", user, name, st["CapBnd"])
			}
		}
	}
}

// TestEscapeUserNamespace: where the daemon remaps user namespaces
// (userns-remap), root in a sandbox is not root on the host; elsewhere
// the test only logs the map.
func TestEscapeUserNamespace(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	info, err := p.cli.Info(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	remapped := slices.ContainsFunc(info.SecurityOptions, func(o string) bool { return strings.Contains(o, "name=userns") })
	res := run(t, p, id, "cat /proc/self/uid_map")
	f := strings.Fields(string(res.Stdout))
	if len(f) < 3 {
		t.Fatalf("uid_map %q %q", res.Stdout, res.Stderr)
	}
	t.Logf("daemon remaps user namespaces: %v; uid_map %q", remapped, res.Stdout)
	if remapped && (f[0] != "0" || f[1] == "0") {
		t.Errorf("root inside maps to host uid %s under userns-remap", f[1])
	}
}

// procStatus parses /proc/<pid>/status.
func procStatus(s string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// TestEscapeNamespaces: no new user namespace (unshare -U, unshare -r),
// mount namespace or mount; the daemon's seccomp profile and the missing
// CAP_SYS_ADMIN refuse them all.
func TestEscapeNamespaces(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	for _, cmd := range []string{
		"unshare -U true",
		"unshare -r id -u",
		"unshare -U -r -m true",
		"unshare -m true",
		"unshare -p -f true",
		"mkdir -p /tmp/m && mount -t tmpfs none /tmp/m",
		"mkdir -p /tmp/cg && mount -t cgroup -o memory cgroup /tmp/cg",
	} {
		res := run(t, p, id, cmd)
		if res.ExitCode == 0 {
			t.Errorf("%q succeeded: stdout %q stderr %q", cmd, res.Stdout, res.Stderr)
		}
	}
}

// TestEscapeForkBomb: a fork bomb fills the sandbox's pids limit (the
// default one) and no more, on the kernel's count (the container's pids
// cgroup: its peak, and the forks it refused) and in the host's process
// table; the command's end kills it, and the sandbox answers again.
func TestEscapeForkBomb(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	ctx := ctxFor(t, 3*time.Minute)
	info, err := p.cli.ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	limit := int64(DefaultPidsLimit)
	if info.HostConfig.PidsLimit == nil || *info.HostConfig.PidsLimit != limit {
		t.Fatalf("pids limit %v, want the default %d", info.HostConfig.PidsLimit, limit)
	}
	cg := pidsCgroup(t, info.State.Pid)
	if got := cgroupInt(t, cg, "pids.max", ""); got != limit {
		t.Fatalf("the kernel's pids.max is %d, want %d", got, limit)
	}
	// The agent's threads count too: the bomb's end must bring the count
	// back to where it was.
	base := cgroupInt(t, cg, "pids.current", "")
	// A bomb whose first forks fail for a reason of the host's (a
	// neighbour's load) dies out before it reaches the limit and proves
	// nothing: try again.
	for attempt := 1; ; attempt++ {
		refused := cgroupInt(t, cg, "pids.events", "max")
		b := forkBomb(ctx, t, p, id, info.ID)
		refused = cgroupInt(t, cg, "pids.events", "max") - refused
		peak := cgroupInt(t, cg, "pids.peak", "")
		t.Logf("bomb %d: the kernel refused %d forks, peak %d pids in the sandbox's cgroup; %d host processes in it at most, host processes %d -> %d",
			attempt, refused, peak, b.peakIn, b.baseAll, b.peakAll)
		if peak > limit || b.peakIn > limit {
			t.Errorf("%d pids (cgroup peak) / %d host processes in the sandbox's cgroup, limit %d", peak, b.peakIn, limit)
		}
		if b.peakIn > 0 && b.peakAll-b.baseAll > 2*limit {
			// Other processes come and go on a shared machine: the
			// slack. An unlimited bomb reaches pid_max in seconds.
			t.Errorf("host processes grew from %d to %d with a sandbox limit of %d", b.baseAll, b.peakAll, limit)
		}
		if refused > 0 {
			if peak < limit*3/4 {
				t.Errorf("forks refused at a peak of %d pids, limit %d", peak, limit)
			}
			if !contains(b.res.Stderr, "fork") {
				t.Errorf("the bomb never failed to fork: stderr %.200q", b.res.Stderr)
			}
			break
		}
		t.Logf("bomb %d died out before the limit: stderr %.300q", attempt, b.res.Stderr)
		if attempt == 3 {
			t.Fatalf("the bomb never ran into the limit (peak %d of %d pids; stderr %.300q)", peak, limit, b.res.Stderr)
		}
	}

	// The agent's sweep at the command's end took the bomb down: the
	// sandbox answers and holds only what it held before.
	testkit.Eventually(t, "the sandbox to answer after the bomb", 20*time.Second, func() bool {
		res, err := p.Exec(ctx, id, providers.ExecRequest{Command: "echo alive", Timeout: 30 * time.Second, MaxOutput: 1024})
		return err == nil && string(res.Stdout) == "alive\n"
	})
	testkit.Eventually(t, "the bomb's processes to be gone", 20*time.Second, func() bool {
		return cgroupInt(t, cg, "pids.current", "") <= base+2
	})
}

type bombResult struct {
	res                      providers.ExecResult
	peakIn, baseAll, peakAll int64
}

// forkBomb runs a fork bomb in sandbox id (container cid) for 6 s (read -t
// on a fifo needs no fork), after which the agent kills it with the
// command's tree. Meanwhile it samples the host's processes.
func forkBomb(ctx context.Context, t *testing.T, p *Docker, id, cid string) bombResult {
	t.Helper()
	type result struct {
		res providers.ExecResult
		err error
	}
	var b bombResult
	b.baseAll, _ = hostProcs(cid)
	done := make(chan result, 1)
	go func() {
		res, err := p.Exec(ctx, id, providers.ExecRequest{
			Command: "rm -f /tmp/bomb.wait; mkfifo /tmp/bomb.wait && b(){ b|b& }; b; read -t 6 x <> /tmp/bomb.wait; echo bomb-over",
			Timeout: time.Minute, MaxOutput: 1 << 20,
		})
		done <- result{res, err}
	}()
	var r result
	for finished := false; !finished; {
		all, in := hostProcs(cid)
		b.peakAll, b.peakIn = max(b.peakAll, all), max(b.peakIn, in)
		tick := time.NewTimer(100 * time.Millisecond)
		select {
		case r = <-done:
			finished = true
		case <-tick.C:
		}
		tick.Stop()
	}
	if r.err != nil || r.res.TimedOut {
		t.Fatalf("bomb exec: %v timed out %v stdout %.200q stderr %.200q", r.err, r.res.TimedOut, r.res.Stdout, r.res.Stderr)
	}
	if !contains(r.res.Stdout, "bomb-over") {
		// The command's own shell could not fork (busybox sh exits on
		// that): the bomb filled the limit before it, or, under a
		// neighbour's load, the host refused the fork. The caller's
		// counts tell which.
		t.Logf("the bomb's shell itself could not fork (exit %d)", r.res.ExitCode)
	}
	b.res = r.res
	return b
}

// pidsCgroup is the directory of the pids cgroup of the process pid (a
// container's init), cgroup v1 or v2.
func pidsCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatalf("the container's cgroup (the daemon must run on this host): %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		switch {
		case len(f) != 3:
		case slices.Contains(strings.Split(f[1], ","), "pids"):
			return "/sys/fs/cgroup/pids" + f[2]
		case f[0] == "0" && f[1] == "":
			if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
				return "/sys/fs/cgroup" + f[2]
			}
		}
	}
	t.Fatalf("no pids cgroup in %q", b)
	return ""
}

// cgroupInt reads a number from file in cgroup dir: the whole file, or
// the value of key in a flat-keyed file.
func cgroupInt(t *testing.T, dir, file, key string) int64 {
	t.Helper()
	b, err := os.ReadFile(dir + "/" + file)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(b))
	if key != "" {
		for _, line := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(line, key+" "); ok {
				s = v
				break
			}
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%s/%s: %q", dir, file, b)
	}
	return n
}

// hostProcs counts the processes this test can see in /proc and those of
// them in the cgroup of container cid (0 when the daemon's processes are
// not visible from here, e.g. a remote daemon).
func hostProcs(cid string) (all, in int64) {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/cgroup")
		if err != nil {
			continue
		}
		all++
		if strings.Contains(string(b), cid) {
			in++
		}
	}
	return all, in
}

// TestEscapeMemory: the default memory limit is set (swap included) and
// seen inside; an allocation under it works and one of 3 GiB is
// OOM-killed, leaving the sandbox alive.
func TestEscapeMemory(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	info, err := p.cli.ContainerInspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	const want = DefaultMemoryLimitMiB << 20
	if info.HostConfig.Memory != want || info.HostConfig.MemorySwap != want {
		t.Fatalf("memory %d swap %d, want both %d", info.HostConfig.Memory, info.HostConfig.MemorySwap, want)
	}
	// cgroup v1, then v2.
	res := run(t, p, id, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max")
	if got := strings.TrimSpace(string(res.Stdout)); got != strconv.Itoa(want) {
		t.Errorf("cgroup memory limit inside: %q (stderr %q), want %d", got, res.Stderr, want)
	}
	// A command is the OOM killer's first choice, ahead of the agent
	// that holds the sandbox's terminal sessions.
	res = run(t, p, id, `cat /proc/self/oom_score_adj; for d in /proc/[0-9]*; do grep -q serve $d/cmdline 2>/dev/null && [ "$(cat $d/comm)" = sandgate-agent ] && cat $d/oom_score_adj; done`)
	if got := string(res.Stdout); got != "1000\n0\n" {
		t.Errorf("oom_score_adj of a command and of the agent: %q (stderr %q), want 1000 and 0", got, res.Stderr)
	}
	// busybox dd allocates its block and, with fullblock, touches all of it.
	if res := run(t, p, id, "dd if=/dev/zero of=/dev/null bs=1000M count=1 iflag=fullblock"); res.ExitCode != 0 {
		t.Errorf("1000 MiB under a %d MiB limit: exit %d, stderr %q", DefaultMemoryLimitMiB, res.ExitCode, res.Stderr)
	}
	if res := run(t, p, id, "dd if=/dev/zero of=/dev/null bs=3000M count=1 iflag=fullblock"); res.ExitCode != 128+int(syscall.SIGKILL) {
		t.Errorf("3000 MiB over a %d MiB limit: exit %d, stderr %q; want OOM-killed (137)", DefaultMemoryLimitMiB, res.ExitCode, res.Stderr)
	}
	if res := run(t, p, id, "echo alive"); string(res.Stdout) != "alive\n" {
		t.Errorf("after the OOM kill: %q %q", res.Stdout, res.Stderr)
	}
}

// TestEscapeDevNodes: the sandbox's /dev is its own. chmod of /dev/null
// and /dev/full inside changes nothing on the host, and no device node can
// be made.
func TestEscapeDevNodes(t *testing.T) {
	type node struct {
		mode os.FileMode
		rdev uint64
	}
	stat := func(path string) node {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return node{fi.Mode(), uint64(fi.Sys().(*syscall.Stat_t).Rdev)}
	}
	paths := []string{"/dev/null", "/dev/full"}
	before := map[string]node{}
	for _, path := range paths {
		before[path] = stat(path)
		t.Cleanup(func() {
			// Should the attack ever work, give the host its nodes back.
			if now := stat(path); now.mode != before[path].mode {
				os.Chmod(path, before[path].mode.Perm())
			}
		})
	}

	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	res := run(t, p, id, "chmod 000 /dev/null && chmod 0600 /dev/full && stat -c '%n %a' /dev/null /dev/full")
	if res.ExitCode != 0 || string(res.Stdout) != "/dev/null 0\n/dev/full 600\n" {
		// Refused outright is fine too; log what happened.
		t.Logf("chmod inside: exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	for _, path := range paths {
		if now := stat(path); now != before[path] {
			t.Errorf("host %s changed from %v to %v", path, before[path], now)
		}
	}
	for _, cmd := range []string{"mknod /tmp/sda b 8 0", "mknod /tmp/mem c 1 1", "mknod /tmp/null c 1 3"} {
		if res := run(t, p, id, cmd); res.ExitCode == 0 {
			t.Errorf("%q succeeded", cmd)
		}
	}
}

// TestEscapeProcMasks: the daemon's default masked paths (/proc/kcore
// among them) are masked and its read-only paths (/proc/sys among them)
// are read-only: the provider passes no list that would clear them.
func TestEscapeProcMasks(t *testing.T) {
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	info, err := p.cli.ContainerInspect(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	masked, ro := info.HostConfig.MaskedPaths, info.HostConfig.ReadonlyPaths
	if !slices.Contains(masked, "/proc/kcore") || !slices.Contains(ro, "/proc/sys") {
		t.Fatalf("masked %v read-only %v: the defaults are gone", masked, ro)
	}
	mounts := map[string]string{} // mount point -> options
	for _, l := range strings.Split(string(run(t, p, id, "cat /proc/mounts").Stdout), "\n") {
		if f := strings.Fields(l); len(f) >= 4 {
			mounts[f[1]] = f[3]
		}
	}
	seen := 0
	for _, path := range masked {
		// A path this kernel lacks (no /proc/kcore without
		// CONFIG_PROC_KCORE) is not there to mask.
		if res := run(t, p, id, "test -e "+path); res.ExitCode != 0 {
			t.Logf("%s: not in this kernel", path)
			continue
		}
		seen++
		if _, ok := mounts[path]; !ok {
			t.Errorf("%s is not masked", path)
		}
	}
	if seen == 0 {
		t.Errorf("none of the masked paths %v exists inside", masked)
	}
	if res := run(t, p, id, "head -c 64 /proc/kcore 2>/dev/null | wc -c; head -c 64 /proc/keys | wc -c"); strings.Join(strings.Fields(string(res.Stdout)), " ") != "0 0" {
		t.Errorf("/proc/kcore or /proc/keys readable: %q", res.Stdout)
	}
	for _, path := range ro {
		opts, ok := mounts[path]
		if !ok {
			if res := run(t, p, id, "test -e "+path); res.ExitCode == 0 {
				t.Errorf("%s is not a read-only mount", path)
			}
			continue
		}
		if !slices.Contains(strings.Split(opts, ","), "ro") {
			t.Errorf("%s mounted %s", path, opts)
		}
	}
	if res := run(t, p, id, "echo 1 > /proc/sys/kernel/hostname"); res.ExitCode == 0 || !contains(res.Stderr, "Read-only") {
		t.Errorf("write to /proc/sys: exit %d stderr %q", res.ExitCode, res.Stderr)
	}
	if res := run(t, p, id, "echo b > /proc/sysrq-trigger"); res.ExitCode == 0 {
		t.Errorf("write to /proc/sysrq-trigger succeeded")
	}
}

// TestEscapeHostFiles: the sandbox has its own root and pid namespace:
// neither the host's /etc/shadow nor a file the test plants on the host is
// reachable by path, through /proc/<pid>/root or by search, and pid 1 is
// the container's init.
func TestEscapeHostFiles(t *testing.T) {
	secret := "sandgate-escape-" + newNonce()
	planted := filepath.Join(t.TempDir(), secret)
	if err := os.WriteFile(planted, []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := newProvider(t)
	id := create(t, p, providers.CreateSpec{})
	res := run(t, p, id, "for f in /etc/shadow "+planted+"; do cat $f /proc/1/root$f /proc/self/root$f; done 2>&1; "+
		"cd /proc/self/root && cd ../.. && cat ./etc/shadow ."+planted+" 2>&1; "+
		"find / -xdev -name "+secret+"; tr '\\0' ' ' < /proc/1/cmdline")
	out := string(res.Stdout)
	// Its content, or a path find printed, ends in secret+newline; the
	// errors of cat name it in quotes.
	if n := strings.Count(out, secret+"\n"); n > 0 {
		t.Errorf("the file planted on the host was found or read inside (%d times): %q", n, out)
	}
	if shadow, err := os.ReadFile("/etc/shadow"); err == nil {
		for _, l := range strings.Split(string(shadow), "\n") {
			if l != "" && strings.Contains(out, l) {
				t.Errorf("host /etc/shadow line of %q visible inside", strings.SplitN(l, ":", 2)[0])
			}
		}
	}
	if !strings.Contains(out, "docker-init") {
		t.Errorf("pid 1 inside is not the container's init: %q", out)
	}
	t.Logf("inside: %s", out)
}
