package seccomp

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// lookPath returns the absolute path of a program the test needs,
// skipping the test without it (failing it in CI, where .ci/run installs
// them).
func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (.ci/run installs it)", name)
		}
		t.Skipf("%s not installed", name)
	}
	return p
}

// TestCommands runs real programs forked from the filtered thread.
func TestCommands(t *testing.T) {
	sh := lookPath(t, "sh")
	status := []string{sh, "-c", "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"}
	for _, c := range []struct {
		name string
		argv func(t *testing.T) []string
		want string
	}{
		{"echo", func(*testing.T) []string { return []string{sh, "-c", "echo ok"} }, "ok\n"},
		{"proc", func(*testing.T) []string { return []string{sh, "-c", "ls /proc/self >/dev/null && echo ok"} }, "ok\n"},
		// The command inherits the filter, and the root that runs it got
		// no no_new_privs: setuid binaries still work.
		{"inherits the filter", func(*testing.T) []string { return status }, "NoNewPrivs:\t0\nSeccomp:\t2\n"},
		{"python", func(t *testing.T) []string {
			return []string{lookPath(t, "python3"), "-c", "import os, socket; socket.socket().close(); print('ok')"}
		}, "ok\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := child(t, append([]string{"--"}, c.argv(t)...)...)
			if res.code != 0 || res.stdout != c.want {
				t.Fatalf("exit %d, stdout %q, want %q; stderr: %s", res.code, res.stdout, c.want, res.stderr)
			}
		})
	}
}

// TestRefusedCommands runs programs that the filter must stop, and, as a
// control, the same programs without it, which must succeed.
func TestRefusedCommands(t *testing.T) {
	for _, c := range []struct {
		name string
		argv func(t *testing.T) []string
	}{
		{"unshare -U", func(t *testing.T) []string { return []string{lookPath(t, "unshare"), "-U", "true"} }},
		{"unshare -r", func(t *testing.T) []string { return []string{lookPath(t, "unshare"), "-r", "true"} }},
		{"mount", func(t *testing.T) []string {
			return []string{lookPath(t, "mount"), "-t", "tmpfs", "none", t.TempDir()}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			argv := c.argv(t)
			if res := child(t, append([]string{"-filter=false", "--"}, argv...)...); res.code != 0 {
				t.Fatalf("without the filter: exit %d; stderr: %s", res.code, res.stderr)
			}
			res := child(t, append([]string{"--"}, argv...)...)
			if res.code == 0 {
				t.Fatalf("with the filter it succeeded; stdout: %s", res.stdout)
			}
			t.Logf("refused: exit %d: %s", res.code, strings.TrimSpace(res.stderr))
		})
	}
}

// TestSyscalls makes each syscallCase marked kernel for real from the
// filtered thread, and from an unfiltered one as a control.
func TestSyscalls(t *testing.T) {
	cases, err := syscallCases()
	if err != nil {
		t.Fatal(err)
	}
	filtered := probeSyscalls(t, "-filter=true")
	plain := probeSyscalls(t, "-filter=false")
	for i, c := range cases {
		if !c.kernel {
			continue
		}
		got, without := filtered[i], plain[i]
		switch {
		case c.want == 0 && got != without:
			t.Errorf("%s: %v, but %v without the filter: it must let the call through", c.desc, errnoString(got), errnoString(without))
		case c.want != 0 && got != c.want:
			t.Errorf("%s: %v, want %v", c.desc, errnoString(got), c.want)
		case c.want != 0 && without == c.want:
			t.Errorf("%s: %v without the filter too: the case tests nothing", c.desc, c.want)
		}
	}
}

func errnoString(e syscall.Errno) string {
	if e == 0 {
		return "success"
	}
	return e.Error()
}

// probeSyscalls runs the syscalls probe and returns each case's errno by
// index.
func probeSyscalls(t *testing.T, filter string) map[int]syscall.Errno {
	t.Helper()
	res := child(t, filter, "-probe=syscalls")
	if res.code != 0 {
		t.Fatalf("probe %s: exit %d: %s", filter, res.code, res.stderr)
	}
	out := make(map[int]syscall.Errno)
	sc := bufio.NewScanner(strings.NewReader(res.stdout))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			t.Fatalf("probe %s: line %q", filter, sc.Text())
		}
		i, err1 := strconv.Atoi(f[0])
		e, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("probe %s: line %q", filter, sc.Text())
		}
		out[i] = syscall.Errno(e)
	}
	return out
}

// TestCallingThreadOnly: Install filters the thread that calls it and no
// other, including the threads the runtime starts afterwards.
func TestCallingThreadOnly(t *testing.T) {
	res := child(t, "-probe=threads")
	var filtered, total int
	if _, err := fmt.Sscanf(res.stdout, "%d of %d", &filtered, &total); err != nil {
		t.Fatalf("probe output %q: %v", res.stdout, err)
	}
	if filtered != 1 || total < 2 {
		t.Fatalf("%d of %d threads filtered, want 1 of several", filtered, total)
	}
}

// TestForkerThread sets up the thread as the local provider's forker
// does: CAP_SYS_ADMIN and CAP_SYS_PTRACE out of its bounding set, still in
// its effective set. That suffices to install the filter without
// no_new_privs.
func TestForkerThread(t *testing.T) {
	sh := lookPath(t, "sh")
	res := child(t, "-drop-bounding", "--", sh, "-c", "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status && echo ok")
	if want := "NoNewPrivs:\t0\nSeccomp:\t2\nok\n"; res.code != 0 || res.stdout != want {
		t.Fatalf("exit %d, stdout %q, want %q; stderr: %s", res.code, res.stdout, want, res.stderr)
	}
}

// TestNoNewPrivsFallback: a thread without CAP_SYS_ADMIN in its
// effective set gets no_new_privs, and so do its commands.
func TestNoNewPrivsFallback(t *testing.T) {
	sh := lookPath(t, "sh")
	res := child(t, "-drop-admin", "--", sh, "-c", "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status")
	if want := "NoNewPrivs:\t1\nSeccomp:\t2\n"; res.code != 0 || res.stdout != want {
		t.Fatalf("exit %d, stdout %q, want %q; stderr: %s", res.code, res.stdout, want, res.stderr)
	}
}
