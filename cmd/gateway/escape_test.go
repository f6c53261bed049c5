package main

// The escape suite: each test runs an attack from inside a real local
// sandbox (or with one sandbox's lease) through a real gateway process,
// and asserts it fails. Each attack worked against an earlier build.

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers/local"
	"github.com/sandgate/sandgate/internal/testkit"
)

// escBox is a sandbox and its owner token.
type escBox struct {
	t   *testing.T
	g   *proc
	ID  string `json:"sandbox_id"`
	Tok string `json:"lease_token"`
}

func escCreate(t *testing.T, g *proc, body string) *escBox {
	t.Helper()
	s, data := call(t, "POST", g.URL+"/v1/sandboxes", body)
	b := &escBox{t: t, g: g}
	if err := json.Unmarshal(data, b); s != 201 || err != nil {
		t.Fatalf("create %s: %d %s", body, s, data)
	}
	return b
}

func (b *escBox) url(rest string) string { return b.g.URL + "/v1/sandboxes/" + b.ID + rest }

// sh runs command in the sandbox and returns stdout+stderr and the exit code.
func (b *escBox) sh(command string) (string, int) {
	b.t.Helper()
	body, _ := json.Marshal(map[string]any{"command": command, "timeout_s": 60})
	s, data := call(b.t, "POST", b.url("/exec"), string(body), "X-Sandbox-Lease", b.Tok)
	var r struct {
		Stdout, Stderr string
		ReturnCode     int `json:"return_code"`
	}
	if err := json.Unmarshal(data, &r); s != 200 || err != nil {
		b.t.Fatalf("exec %q: %d %s", command, s, data)
	}
	return r.Stdout + r.Stderr, r.ReturnCode
}

// file asks the streaming file route for path (GET, or PUT with body).
func (b *escBox) file(method, path, body string) (int, string) {
	b.t.Helper()
	s, data := call(b.t, method, b.url("/files?path="+path), body, "X-Sandbox-Lease", b.Tok)
	return s, string(data)
}

// state is the local provider's record of the sandbox.
func (b *escBox) state(stateDir string) (pid int, cgroups map[string]string) {
	b.t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, "local", "sandboxes", b.ID, "state.json"))
	if err != nil {
		b.t.Fatal(err)
	}
	var st struct {
		Pid     int               `json:"pid"`
		Cgroups map[string]string `json:"cgroups"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		b.t.Fatal(err)
	}
	return st.Pid, st.Cgroups
}

// TestEscapeHostSecrets: nothing of the host's own is visible inside, not
// even through the file routes: no shadow, no /root, no Docker state, no
// lease key or store wherever the state directory is; sandbox root is not
// host root; and a token forged with the signing key gets nothing more
// than the lease it names.
func TestEscapeHostSecrets(t *testing.T) {
	t.Parallel()
	for _, parent := range []string{"/root", "/opt"} {
		// One after the other: the sandbox's root shows the host's /opt,
		// where the other one's gateway would keep its lease key.
		t.Run(strings.TrimPrefix(parent, "/"), func(t *testing.T) {
			stateDir, err := os.MkdirTemp(parent, "sandgate-escape-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(stateDir) })
			g := startGateway(t, stateDir, nil)
			b := escCreate(t, g, `{}`)

			for _, c := range []struct{ name, cmd, want string }{
				{"shadow", "cat /etc/shadow /etc/gshadow 2>/dev/null; echo rc=$?", "rc=1\n"},
				{"private homes", "ls -A /root /home /srv /var/lib /run | grep -v ':$' | grep -c . ", "0\n"},
				{"docker state", "test -e /var/lib/docker || echo absent", "absent\n"},
				{"ssh and sudo", "ls /etc/ssh /etc/sudoers /etc/sudoers.d 2>/dev/null | grep -c .", "0\n"},
				{"state dir", "ls -A " + stateDir + " 2>/dev/null | grep -c .", "0\n"},
				{"key and store anywhere", "find / \\( -path /proc -o -path /sys \\) -prune -o \\( -name lease.key -o -name sandgate.db \\) -print 2>/dev/null | grep -c .", "0\n"},
			} {
				if got, _ := b.sh(c.cmd); got != c.want {
					t.Errorf("%s: %q, want %q", c.name, got, c.want)
				}
			}
			pid, _ := b.state(stateDir)
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(string(status), "\n") {
				if f := strings.Fields(line); len(f) > 1 && (f[0] == "Uid:" || f[0] == "Gid:") {
					if id, _ := strconv.Atoi(f[1]); id < local.DefaultIDBase {
						t.Errorf("sandbox init runs as host %s %d", f[0], id)
					}
				}
			}

			for _, p := range []string{"/etc/shadow", "/root/.bashrc", stateDir + "/lease.key"} {
				if s, body := b.file("GET", p, ""); s != 404 {
					t.Errorf("GET %s: %d %.80q, want 404", p, s, body)
				}
			}

			// A token forged with the real key: owner claims for an
			// operate lease. The key stays on the host, but even with it
			// the token gets what its lease allows, not what it says.
			s, data := call(t, "POST", b.url("/leases"), `{"scope":"operate","ttl_s":600}`, "X-Sandbox-Lease", b.Tok)
			var op struct {
				Extra struct {
					LeaseID string `json:"lease_id"`
				} `json:"extra"`
			}
			if err := json.Unmarshal(data, &op); s != 201 || err != nil || op.Extra.LeaseID == "" {
				t.Fatalf("mint: %d %s", s, data)
			}
			forged := forgeToken(t, stateDir, b.ID, op.Extra.LeaseID, "owner")
			if s, data := call(t, "DELETE", b.url(""), "", "X-Sandbox-Lease", forged); s != 401 {
				t.Errorf("delete with a forged owner token: %d %s", s, data)
			}
			if got, _ := b.sh("echo alive"); got != "alive\n" {
				t.Errorf("after the forged delete: %q", got)
			}
		})
	}
}

// forgeToken mints a token as an attacker holding the signing key would
// (the key is hex in <state>/lease.key; the format is the token's, see
// internal/sandbox/token.go).
func forgeToken(t *testing.T, stateDir, sandbox, leaseID, scope string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(stateDir, "lease.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	payload := sandbox + "|" + leaseID + "|" + scope + "|0"
	m := hmac.New(sha256.New, key)
	m.Write([]byte(payload))
	return "sgl1." + base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// TestEscapeKernelFiles: the file routes refuse /proc and /sys (by
// filesystem type, whatever the path), so an operate lease cannot read
// kernel addresses or reach a kernel parser; the sandbox's own files work.
func TestEscapeKernelFiles(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	g := startGateway(t, stateDir, nil)
	b := escCreate(t, g, `{}`)
	b.sh("ln -s /proc/self/environ /workspace/env-link; ln -s /sys /workspace/sys-link")
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/proc/kallsyms", ""},
		{"GET", "/proc/self/environ", ""},
		{"GET", "/proc/1/status", ""},
		{"GET", "/workspace/env-link", ""},
		{"GET", "/sys/kernel/notes", ""},
		{"GET", "/workspace/sys-link/kernel/notes", ""},
		{"PUT", "/proc/mtrr", "disable=0\n"},
		{"PUT", "/proc/sys/kernel/hostname", "pwned"},
		{"PUT", "/sys/kernel/uevent_helper", "/tmp/x"},
		{"PUT", "/proc/new-file", "x"},
	} {
		if s, body := b.file(c.method, c.path, c.body); s != 400 {
			t.Errorf("%s %s: %d %.100q, want 400", c.method, c.path, s, body)
		}
	}
	if got, _ := b.sh("hostname"); got != "sandbox\n" {
		t.Errorf("hostname after the PUT: %q", got)
	}
	if s, _ := b.file("PUT", "/workspace/ok.txt", "fine"); s != 200 {
		t.Errorf("PUT of an ordinary file: %d", s)
	}
	if s, body := b.file("GET", "/workspace/ok.txt", ""); s != 200 || body != "fine" {
		t.Errorf("GET of an ordinary file: %d %q", s, body)
	}
	// Files the API writes belong to sandbox root inside, to the
	// sandbox's id range outside.
	if got, _ := b.sh("stat -c %u:%g /workspace/ok.txt"); got != "0:0\n" {
		t.Errorf("owner inside: %q", got)
	}
}

// TestEscapeDevNodes: the device nodes are the host's, bound read-only:
// changing their mode or owner from inside fails and the host's nodes are
// untouched; no new device can be made.
func TestEscapeDevNodes(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	b := escCreate(t, g, `{}`)
	before := devModes(t)
	for _, cmd := range []string{"chmod 0666 /dev/full", "chmod 000 /dev/null", "chown 1 /dev/zero", "mknod /tmp/mem c 1 1", "mknod /dev/sda2 b 8 2"} {
		if out, code := b.sh(cmd); code == 0 {
			t.Errorf("%s succeeded: %q", cmd, out)
		}
	}
	if after := devModes(t); after != before {
		t.Errorf("host device nodes changed: %s -> %s", before, after)
	}
	if out, code := b.sh("echo x > /dev/null && head -c 4 /dev/zero | wc -c"); code != 0 || out != "4\n" {
		t.Errorf("devices inside: %q %d", out, code)
	}
}

func devModes(t *testing.T) string {
	var out []string
	for _, n := range []string{"null", "full", "zero"} {
		var st syscall.Stat_t
		if err := syscall.Stat("/dev/"+n, &st); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s:%o:%d:%d", n, st.Mode, st.Uid, st.Gid))
	}
	return strings.Join(out, " ")
}

// TestEscapeNestedUsernsAndCgroups: no user namespace can be made inside
// (so no root of one's own to mount a cgroup hierarchy and raise one's
// limits), the sandbox sees only its own cgroup root, every command runs
// under seccomp, and the limits stay; delete is clean afterwards.
func TestEscapeNestedUsernsAndCgroups(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	g := startGateway(t, stateDir, nil)
	b := escCreate(t, g, `{}`)
	_, cgroups := b.state(stateDir)
	pidsMax, _ := os.ReadFile(cgroups["pids"] + "/pids.max")
	memMax, _ := os.ReadFile(cgroups["memory"] + "/memory.limit_in_bytes")
	for _, cmd := range []string{
		"unshare -U true",
		"unshare -Ur true",
		"unshare -UrmC sh -c 'mount -t cgroup -o pids none /mnt && echo 1000000 > /mnt/pids.max'",
		"python3 -c 'import os; os.unshare(os.CLONE_NEWUSER)'",
		"echo max > /sys/fs/cgroup/pids/pids.max",
		"mount -t cgroup -o memory none /mnt",
	} {
		if out, code := b.sh(cmd); code == 0 {
			t.Errorf("%s succeeded: %q", cmd, out)
		}
	}
	// The cgroup namespace is rooted at the sandbox's cgroups (for pids at
	// their parent, where init's own threads stay: see local.joinPids).
	for _, c := range []struct{ name, cmd, want string }{
		{"cgroup namespace", "cut -d: -f3 /proc/self/cgroup | sort -u", "/\n/sandgate-" + b.ID + "\n"},
		{"seccomp", "grep Seccomp: /proc/self/status | tr -d ' \\t'", "Seccomp:2\n"},
		{"user namespaces off", "cat /proc/sys/user/max_user_namespaces", "0\n"},
	} {
		if got, _ := b.sh(c.cmd); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if b, _ := os.ReadFile(cgroups["pids"] + "/pids.max"); string(b) != string(pidsMax) || len(b) == 0 {
		t.Errorf("pids.max %q -> %q", pidsMax, b)
	}
	if b, _ := os.ReadFile(cgroups["memory"] + "/memory.limit_in_bytes"); string(b) != string(memMax) || strings.TrimSpace(string(b)) != strconv.Itoa(local.DefaultMemoryMiB<<20) {
		t.Errorf("memory limit %q -> %q, want the default %d MiB", memMax, b, local.DefaultMemoryMiB)
	}
	start := time.Now()
	if s, data := call(t, "DELETE", b.url(""), "", "X-Sandbox-Lease", b.Tok); s != 200 {
		t.Fatalf("delete: %d %s", s, data)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("delete took %v", d)
	}
	for ctrl, dir := range cgroups {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s cgroup left after delete", ctrl)
		}
	}
}

// TestEscapeDiskAndProcesses: writing past disk_gib fails inside with
// ENOSPC and leaves the host as it was once deleted; a fork bomb is held
// by the sandbox's pids limit while the host forks on.
func TestEscapeDiskAndProcesses(t *testing.T) {
	// Serial: the fork bomb needs the CPU to reach the pids limit within
	// its exec, and starves any test beside it.
	stateDir := t.TempDir()
	g := startGateway(t, stateDir, nil)
	b := escCreate(t, g, `{"resources":{"disk_gib":0.5}}`)
	out, code := b.sh("head -c 1G /dev/zero > /workspace/big; echo rc=$?; sync")
	if !strings.Contains(out, "No space left on device") || !strings.Contains(out, "rc=1") {
		t.Errorf("1 GiB into a 0.5 GiB disk: %q %d", out, code)
	}
	img := filepath.Join(stateDir, "local", "sandboxes", b.ID, "disk.img")
	var st syscall.Stat_t
	if err := syscall.Stat(img, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 512<<20 {
		t.Errorf("disk image holds %d bytes on the host, over the 0.5 GiB limit", used)
	}
	if out, s := b.file("PUT", "/workspace/more", strings.Repeat("x", 1<<20)); out != 413 {
		t.Errorf("upload into a full disk: %d %.100q, want 413", out, s)
	}
	if got, _ := b.sh("rm /workspace/big && df -k /dev/shm | tail -1 | awk '{print $2}'"); got != "65536\n" {
		t.Errorf("/dev/shm size: %q KiB", got)
	}

	// The fork bomb runs until its exec times out; meanwhile the host
	// must still be able to start a process. It has 20 s to meet the
	// limit: on a loaded 2-core machine forks are slow.
	_, cgroups := b.state(stateDir)
	bomb := make(chan string, 1)
	bombStart := time.Now()
	go func() {
		body := `{"command":"f(){ f | f & }; f; sleep 18","timeout_s":20}`
		s, data := call(t, "POST", b.url("/exec"), body, "X-Sandbox-Lease", b.Tok)
		bomb <- fmt.Sprintf("%d %.200s", s, data)
	}()
	// A counter that has no notification.
	testkit.EventuallyNil(t, "the fork bomb to reach the pids limit", 30*time.Second, func() error {
		if ev, _ := os.ReadFile(cgroups["pids"] + "/pids.events"); strings.TrimSpace(string(ev)) != "max 0" {
			return nil
		}
		cur, _ := os.ReadFile(cgroups["pids"] + "/pids.current")
		lim, _ := os.ReadFile(cgroups["pids"] + "/pids.max")
		mem, _ := os.ReadFile(cgroups["memory"] + "/memory.failcnt")
		return fmt.Errorf("pids %s of %s, memory failcnt %s", bytes.TrimSpace(cur), bytes.TrimSpace(lim), bytes.TrimSpace(mem))
	})
	t.Logf("the fork bomb met the pids limit after %v", time.Since(bombStart).Round(time.Millisecond))
	if err := exec.Command("true").Run(); err != nil {
		t.Errorf("the host cannot fork during the bomb: %v", err)
	}
	if r := <-bomb; !strings.HasPrefix(r, "200 ") {
		t.Errorf("fork bomb exec: %s", r)
	}
	if got, _ := b.sh("echo alive"); got != "alive\n" {
		t.Errorf("after the bomb: %q", got)
	}
	if s, data := call(t, "DELETE", b.url(""), "", "X-Sandbox-Lease", b.Tok); s != 200 {
		t.Fatalf("delete: %d %s", s, data)
	}
	if _, err := os.Stat(filepath.Dir(img)); err == nil {
		t.Errorf("sandbox directory left after delete")
	}
}

// TestEscapeOperateMintsLongerLease: a short operate lease cannot mint a
// lease that outlives it, nor an owner lease.
func TestEscapeOperateMintsLongerLease(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	b := escCreate(t, g, `{}`)
	s, data := call(t, "POST", b.url("/leases"), `{"scope":"operate","ttl_s":20}`, "X-Sandbox-Lease", b.Tok)
	var op struct {
		Tok   string `json:"lease_token"`
		Extra struct {
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"extra"`
	}
	if err := json.Unmarshal(data, &op); s != 201 || err != nil {
		t.Fatalf("mint: %d %s", s, data)
	}
	if s, data := call(t, "POST", b.url("/leases"), `{"scope":"operate","ttl_s":950400}`, "X-Sandbox-Lease", op.Tok); s != 400 {
		t.Errorf("operate (20 s) minting an 11-day lease: %d %s", s, data)
	}
	if s, data := call(t, "POST", b.url("/leases"), `{"scope":"owner"}`, "X-Sandbox-Lease", op.Tok); s != http.StatusForbidden {
		t.Errorf("operate minting owner: %d %s", s, data)
	}
	s, data = call(t, "POST", b.url("/leases"), `{"scope":"operate"}`, "X-Sandbox-Lease", op.Tok)
	var child struct {
		Extra struct {
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"extra"`
	}
	if err := json.Unmarshal(data, &child); s != 201 || err != nil {
		t.Fatalf("mint without ttl: %d %s", s, data)
	}
	if child.Extra.ExpiresAt.IsZero() || child.Extra.ExpiresAt.After(op.Extra.ExpiresAt) {
		t.Errorf("child lease expires %v, after its parent's %v", child.Extra.ExpiresAt, op.Extra.ExpiresAt)
	}
}

// TestEscapeThroughSharedSnapshot: forks share their source's snapshot
// layer. Hostile code in one fork tries every way of changing a file it
// got from the layer (write, append, truncate, chmod, chown, xattr, hard
// link, rename, delete, a setuid bit) and of reaching the layer's
// filesystem itself (mount, the block device, the loop device); its
// sibling and the source see none of it.
func TestEscapeThroughSharedSnapshot(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	src := escCreate(t, g, `{}`)
	if out, code := src.sh(`set -e; cd /workspace; echo shared > f; cp /bin/sh ./prog; mkdir d; echo x > d/x`); code != 0 {
		t.Fatalf("prepare: %s", out)
	}
	s, data := call(t, "POST", src.url("/fork"), `{"count":2}`, "X-Sandbox-Lease", src.Tok)
	var fork struct {
		Sandboxes []escBox `json:"sandboxes"`
	}
	if err := json.Unmarshal(data, &fork); s != 201 || err != nil || len(fork.Sandboxes) != 2 {
		t.Fatalf("fork: %d %s", s, data)
	}
	evil, sibling := &fork.Sandboxes[0], &fork.Sandboxes[1]
	evil.t, evil.g, sibling.t, sibling.g = t, g, t, g
	out, _ := evil.sh(`cd /workspace
		echo evil > f; echo more >> f; truncate -s 1 f; chmod 4777 prog; chown 1234:1234 prog
		setfattr -n user.evil -v 1 prog 2>&1; ln prog hard; mv d d2; rm -rf d2
		for dev in /dev/loop0 /dev/vda /dev/sda; do test -e $dev && echo "device $dev present"; done
		mount -t btrfs /dev/loop0 /mnt 2>/dev/null && echo MOUNTED
		grep -c btrfs /proc/self/mountinfo || true`)
	if strings.Contains(out, "MOUNTED") || strings.Contains(out, "device ") {
		t.Errorf("the fork reached the layer's filesystem:\n%s", out)
	}
	if got, _ := evil.sh(`cat /workspace/f; echo; stat -c '%a %u' /workspace/prog`); got != "e\n777 1234\n" { // chown clears the setuid bit
		t.Errorf("the fork's own view after its writes: %q", got)
	}
	const want = "shared\n755 0\nx\n"
	for name, b := range map[string]*escBox{"sibling": sibling, "source": src} {
		got, _ := b.sh(`cd /workspace; cat f; stat -c '%a %u' prog; cat d/x; test -e hard && echo hard-exists; true`)
		if got != want {
			t.Errorf("the %s sees the fork's changes: %q, want %q", name, got, want)
		}
	}
}

// TestEscapeProcListing: files/list and files/info refuse /proc (its
// links, resolved by the gateway as host root, answered with host paths
// the sandbox itself cannot read) as reads do, and describe what the
// sandbox sees: a symlink's target is readlink's inside.
func TestEscapeProcListing(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	g := startGateway(t, stateDir, nil)
	b := escCreate(t, g, `{}`)
	b.sh("ln -s /var/lib/host-only/secret /workspace/hl")
	hostPaths := []string{stateDir, filepath.Dir(gatewayBin)}
	for _, route := range []string{"list", "info"} {
		for _, p := range []string{"/proc/1/fd", "/proc/1/exe", "/proc/self/root", "/proc/1/cwd", "/proc/1/root/workspace"} {
			s, body := call(t, "GET", b.url("/files/"+route+"?path="+p), "", "X-Sandbox-Lease", b.Tok)
			if s != 400 {
				t.Errorf("files/%s %s: %d %.200s, want 400", route, p, s, body)
			}
			for _, h := range hostPaths {
				if bytes.Contains(body, []byte(h)) {
					t.Errorf("files/%s %s names the host path %s: %s", route, p, h, body)
				}
			}
		}
	}
	inside, _ := b.sh("readlink /workspace/hl")
	s, body := call(t, "GET", b.url("/files/info?path=/workspace/hl"), "", "X-Sandbox-Lease", b.Tok)
	var fi struct {
		Type   string
		Target string `json:"symlink_target"`
	}
	if err := json.Unmarshal(body, &fi); s != 200 || err != nil || fi.Type != "symlink" || fi.Target+"\n" != inside {
		t.Errorf("files/info of a symlink: %d %s, readlink inside %q", s, body, inside)
	}
	s, body = call(t, "GET", b.url("/files/list?path=/workspace"), "", "X-Sandbox-Lease", b.Tok)
	if s != 200 || !bytes.Contains(body, []byte(`"name":"hl"`)) {
		t.Errorf("files/list of the workdir: %d %s", s, body)
	}
}

// TestEscapeInitKilled: SIGSEGV sent to init from inside ends the
// sandbox, which then reads error with the signal named, not stopped; it
// is deleted as any other.
func TestEscapeInitKilled(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil)
	b := escCreate(t, g, `{}`)
	body, _ := json.Marshal(map[string]any{"command": "kill -SEGV 1; sleep 60", "timeout_s": 60})
	call(t, "POST", b.url("/exec"), string(body), "X-Sandbox-Lease", b.Tok) // dies with the sandbox
	var info struct {
		Status string `json:"status"`
		Reason string `json:"status_reason"`
	}
	testkit.Eventually(t, "the sandbox to stop running after kill -SEGV 1", 30*time.Second, func() bool {
		s, data := call(t, "GET", b.url(""), "", "X-Sandbox-Lease", b.Tok)
		if err := json.Unmarshal(data, &info); s != 200 || err != nil {
			t.Fatalf("get: %d %s", s, data)
		}
		return info.Status != "running"
	})
	if info.Status != "error" || !strings.Contains(info.Reason, "SIGSEGV") {
		t.Errorf("after kill -SEGV 1: status %q, reason %q; want error naming SIGSEGV", info.Status, info.Reason)
	}
	if s, data := call(t, "DELETE", b.url(""), "", "X-Sandbox-Lease", b.Tok); s != 200 {
		t.Errorf("delete: %d %s", s, data)
	}
	if s, _ := call(t, "GET", b.url(""), "", "X-Sandbox-Lease", b.Tok); s != 404 {
		t.Errorf("get after delete: %d, want 404", s)
	}
}

// TestEscapeUnknownLocalImage: an image the local provider does not have
// (a registry name, as a new user tries) is refused with 400 naming the
// images it has and how to add one, and nothing is made, where it used to
// run the host's view; a warm pool of such an image stops the start.
func TestEscapeUnknownLocalImage(t *testing.T) {
	t.Parallel()
	stateDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(stateDir, "images", "mini", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, stateDir, nil)
	s, data := call(t, "POST", g.URL+"/v1/sandboxes", `{"image": "python:3.13-slim"}`)
	var p struct{ Detail string }
	json.Unmarshal(data, &p)
	if s != 400 || !strings.Contains(p.Detail, `"mini"`) || !strings.Contains(p.Detail, "docker save python:3.13-slim") || !strings.Contains(p.Detail, "--local-images") {
		t.Errorf("create with python:3.13-slim: %d %s", s, data)
	}
	if strings.Contains(string(data), stateDir) {
		t.Errorf("the refusal names the host path %s: %s", stateDir, data)
	}
	if s, data := call(t, "GET", g.URL+"/v1/sandboxes", ""); s != 200 || !strings.Contains(string(data), `"sandboxes":[]`) {
		t.Errorf("sandboxes after the refusal: %d %s", s, data)
	}
	// The directory, not localSandboxes: a second provider on the state
	// directory while the gateway runs would prune the gateway's host view.
	if entries, err := os.ReadDir(filepath.Join(stateDir, "local", "sandboxes")); err != nil || len(entries) != 0 {
		t.Errorf("the refused create left sandbox directories: %v %v", entries, err)
	}
	if s, data := call(t, "POST", g.URL+"/v1/sandboxes", `{"image": null}`); s != 201 {
		t.Errorf("create with a null image (the host view): %d %s\n%s", s, data, g.stderr)
	}

	cmd := exec.Command(gatewayBin, "serve", "--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--pool", "image=python:3.13-slim=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "python:3.13-slim") {
		t.Errorf("a gateway with a pool of an unknown local image started: %v\n%s", err, out)
	}
}
