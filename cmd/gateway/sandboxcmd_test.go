package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandgate/sandgate/internal/testkit"
)

// TestCLIBadUsage: every malformed command line is a usage error (exit
// 2) that names the problem, before anything is sent (the URL refuses
// connections: a request would fail with 255 instead).
func TestCLIBadUsage(t *testing.T) {
	env := func(k string) (string, bool) {
		if k == "SANDGATE_URL" {
			return "http://127.0.0.1:1", true
		}
		return "", false
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sandbox"}, "usage: gateway sandbox SUBCOMMAND"},
		{[]string{"sandbox", "explode"}, `unknown command "sandbox explode"`},
		{[]string{"sandbox", "get"}, "usage: gateway sandbox get"},
		{[]string{"sandbox", "get", "a", "b"}, "usage: gateway sandbox get"},
		{[]string{"sandbox", "create", "--env", "NOEQUALS"}, "want KEY=VALUE"},
		{[]string{"sandbox", "create", "--ttl", "soon"}, "want a number of seconds"},
		{[]string{"sandbox", "create", "--spec", "{not json"}, "--spec"},
		{[]string{"sandbox", "create", "--spec", "@/nonexistent/spec.json"}, "/nonexistent/spec.json"},
		{[]string{"sandbox", "create", "extra"}, "usage: gateway sandbox create"},
		{[]string{"lease", "mint", "--scope", "god", "sbx-x"}, `--scope "god": want operate or owner`},
		{[]string{"lease", "release", "sbx-x"}, "give the lease to release"},
		{[]string{"cp", "a.txt", "b.txt"}, "exactly one of SRC and DST"},
		{[]string{"cp", "sbx-a:/x", "sbx-b:/y"}, "exactly one of SRC and DST"},
		{[]string{"fork", "--count", "x", "sbx-a"}, "invalid value"},
	} {
		var out, errb bytes.Buffer
		code, ok := runCLI(context.Background(), tc.args, env, strings.NewReader(""), &out, &errb)
		if !ok || code != exitUsage || !strings.Contains(errb.String(), tc.want) || out.Len() != 0 {
			t.Errorf("%q: handled %v, exit %d, stdout %q, stderr %q; want exit %d and %q", tc.args, ok, code, out.String(), errb.String(), exitUsage, tc.want)
		}
	}
	if _, ok := runCLI(context.Background(), []string{"--listen", "x"}, env, nil, nil, nil); ok {
		t.Error("a server flag was taken for a client command")
	}
}

// TestCLIWithAPIKey: on a gateway with API keys, create and list take
// the key, a sandbox's commands take the key that made it in place of a
// lease, and another key sees and reaches nothing of it.
func TestCLIWithAPIKey(t *testing.T) {
	t.Parallel()
	g := startGateway(t, t.TempDir(), nil, "--api-key", "key-one,key-two")
	run := func(key string, args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		env := func(k string) (string, bool) {
			switch k {
			case "SANDGATE_URL":
				return g.URL, true
			case "SANDGATE_API_KEY":
				return key, true
			}
			return "", false
		}
		code, _ := runCLI(context.Background(), args, env, strings.NewReader(""), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, _, errs := run("", "sandbox", "create"); code != exitFailed || !strings.Contains(errs, "401") {
		t.Fatalf("create without a key: exit %d, %s", code, errs)
	}
	code, out, errs := run("key-one", "sandbox", "create", "--label", "who=one", "--json")
	if code != 0 {
		t.Fatalf("create: exit %d: %s", code, errs)
	}
	var ref struct {
		SandboxID string `json:"sandbox_id"`
	}
	if err := json.Unmarshal([]byte(out), &ref); err != nil || ref.SandboxID == "" {
		t.Fatalf("create --json: %v: %q", err, out)
	}
	if code, out, errs := run("key-one", "sandbox", "list", "--label", "who=one"); code != 0 || !strings.Contains(out, ref.SandboxID) || !strings.HasPrefix(out, "SANDBOX") {
		t.Fatalf("list: exit %d: %q %s", code, out, errs)
	}
	if code, out, _ := run("key-two", "sandbox", "list", "--json"); code != 0 || strings.Contains(out, ref.SandboxID) {
		t.Fatalf("another key's list: exit %d: %q", code, out)
	}
	if code, _, errs := run("key-two", "sandbox", "delete", ref.SandboxID); code != exitFailed || !strings.Contains(errs, ref.SandboxID) {
		t.Fatalf("another key's delete: exit %d: %s", code, errs)
	}
	if code, out, errs := run("key-one", "sandbox", "renew", "--ttl", "900", ref.SandboxID); code != 0 || !strings.Contains(out, ref.SandboxID+" expires ") {
		t.Fatalf("renew with the key: exit %d: %q %s", code, out, errs)
	}
	if code, out, errs := run("key-one", "sandbox", "delete", ref.SandboxID, ref.SandboxID); code != 0 || out != "deleted "+ref.SandboxID+"\n" {
		t.Fatalf("delete: exit %d: %q %s", code, out, errs)
	}
	if code, out, errs := run("key-one", "sandbox", "delete", ref.SandboxID); code != exitFailed || out != "" || !strings.Contains(errs, "not found") {
		t.Fatalf("delete of a deleted sandbox: exit %d: %q %s", code, out, errs)
	}
}

// TestHelpListsEveryCommand: `gateway help` (and --help, before the
// server's flags) names every client command.
func TestHelpListsEveryCommand(t *testing.T) {
	var out bytes.Buffer
	if code, ok := runCLI(context.Background(), []string{"help"}, func(string) (string, bool) { return "", false }, nil, &out, nil); !ok || code != 0 {
		t.Fatalf("help: handled %v, exit %d", ok, code)
	}
	names := []string{"exec", "shell", "healthcheck"}
	for name := range cliCommands {
		names = append(names, name)
	}
	for _, name := range names {
		if !strings.Contains(out.String(), "\n  "+name+" ") {
			t.Errorf("help lacks %q:\n%s", name, out.String())
		}
	}
	var errb bytes.Buffer
	if _, err := parseConfig([]string{"--help"}, func(string) (string, bool) { return "", false }, &errb); err == nil || !strings.Contains(errb.String(), "sandbox create") || !strings.Contains(errb.String(), "-listen") {
		t.Errorf("--help: %v\n%s", err, errb.String())
	}
}

// TestTryLine: the curl make run prints fits the gateway: an image where
// the provider needs one, the key header (never a key) where keys are
// required.
func TestTryLine(t *testing.T) {
	for _, tc := range []struct {
		provider string
		keys     bool
		want     []string
		not      []string
	}{
		{"local", false, []string{`-d '{}'`}, []string{"Authorization", "IMAGE"}},
		{"docker", false, []string{`"image": "IMAGE"`, "docker images"}, []string{"Authorization"}},
		{"kubernetes", true, []string{`"image": "IMAGE"`, `Authorization: Bearer $SANDGATE_API_KEY`}, []string{"docker images"}},
	} {
		got := tryLine("http://127.0.0.1:8080", tc.provider, tc.keys)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s keys=%v: lacks %q:\n%s", tc.provider, tc.keys, w, got)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("%s keys=%v: has %q:\n%s", tc.provider, tc.keys, n, got)
			}
		}
	}
}

// TestNonRootNamesTheWayOut: started by a user who cannot make the
// sandbox namespaces, the gateway refuses and names both ways on: root,
// or --local-isolation none.
func TestNonRootNamesTheWayOut(t *testing.T) {
	testkit.RequireRoot(t) // to start the gateway as another user
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "sandgate-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, "serve", "--listen", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--local-isolation none") || !strings.Contains(string(out), "as root") {
		t.Fatalf("as uid 65534: %v\n%s", err, out)
	}
}
