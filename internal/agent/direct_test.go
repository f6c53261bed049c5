package agent

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/testkit"
)

// TestDirectCommandChoice: only a lone simple command of plain words
// that names a program skips bash.
func TestDirectCommandChoice(t *testing.T) {
	_, err := os.Stat("/bin/bash")
	testkit.Need(t, "/bin/bash", err)
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"}
	sh := func(line string, extra ...string) *exec.Cmd {
		cmd, err := newCommand([]string{"/bin/bash", "-c", line}, "", "/", "", nil, append(slices.Clone(env), extra...))
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	for _, tc := range []struct {
		line  string
		user  string
		extra []string
		path  string // "": bash runs it
	}{
		{line: "true", path: "/usr/bin/true"},
		{line: "  env\tA=1 x,y:z@1%+-. ", path: "/usr/bin/env"},
		{line: "/usr/bin/env -0", path: "/usr/bin/env"},
		{line: "ls", extra: []string{"SHLVL=7"}, path: "/usr/bin/ls"},
		{line: "true 1"},         // the builtin, which takes arguments its program reads
		{line: "echo hi"},        // a builtin
		{line: "cd /tmp"},        // a builtin
		{line: "time ls"},        // a keyword
		{line: "A=1 env"},        // an assignment
		{line: "env $HOME"},      // an expansion
		{line: "env ~"},          // a tilde
		{line: "env *"},          // a glob
		{line: "env {a,b}"},      // a brace expansion
		{line: "env 'a b'"},      // a quote
		{line: `env a\ b`},       // a backslash
		{line: "env >/dev/null"}, // a redirection
		{line: "env; env"},       // a list
		{line: "env | cat"},      // a pipe
		{line: "env &"},          // in the background
		{line: "env #c"},         // a comment
		{line: "env\nenv"},       // two lines
		{line: "no-such-program-here"},
		{line: "./env"}, // relative to the command's directory
		{line: "-env"},
		{line: "env", user: "root"},
		{line: "env", extra: []string{"BASH_ENV=/x"}},
		{line: "env", extra: []string{"BASH_FUNC_f%%=() { :; }"}},
		{line: "env", extra: []string{"OLDPWD=/"}},
		{line: "env", extra: []string{"SHLVL=x"}},
		{line: "env", extra: []string{"SHLVL=0010"}},
		{line: "env", extra: []string{"SHLVL=999"}},
		{line: "env", extra: []string{"PATH=bin:/usr/bin"}},
		{line: ""},
	} {
		d := directCommand(sh(tc.line, tc.extra...), tc.line, tc.user)
		got := ""
		if d != nil {
			got = d.Path
		}
		if want := tc.path; got != want && !(want != "" && got != "" && sameFile(got, want)) {
			t.Errorf("%q (env %v, user %q): direct %q, want %q", tc.line, tc.extra, tc.user, got, want)
		}
	}
}

func sameFile(a, b string) bool {
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// TestDirectExecIsBashs runs command lines that skip bash beside the same
// lines with the program's name quoted, which bash runs (and execs the
// program alike): the program sees the same argv, environment (but for
// each command's own marker) and directory, and the result is the same.
func TestDirectExecIsBashs(t *testing.T) {
	_, err := os.Stat("/bin/bash")
	testkit.Need(t, "/bin/bash", err)
	srv := NewServerWith(NewReaper(true), Options{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C"}})
	srv.own = true
	t.Cleanup(srv.Close)
	c := testkit.DialPipe(t, func(a net.Conn) { srv.Serve(a, nil) }, func(b net.Conn) (*agentclient.Client, error) {
		return agentclient.Dial(context.Background(), b)
	})
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("echo from a script without a shebang line\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		line, quoted string
		cwd          string
		env          map[string]string
	}{
		{line: "env", quoted: "'env'"},
		{line: "env", quoted: "'env'", cwd: link},
		{line: "env", quoted: "'env'", cwd: link, env: map[string]string{"PWD": link}},
		{line: "env", quoted: "'env'", env: map[string]string{"PWD": "/nonexistent", "SHLVL": "4"}},
		{line: "/usr/bin/env A=1 B=x,y", quoted: "'/usr/bin/env' A=1 B=x,y"},
		{line: "ls /nonexistent-here", quoted: "'ls' /nonexistent-here"},
		{line: "true", quoted: "'true'"},
		{line: "false", quoted: "'false'"},
		{line: script, quoted: "'" + script + "'"},
	} {
		req := providers.ExecRequest{Cwd: tc.cwd, Env: tc.env}
		req.Command = tc.line
		direct := run(t, c, req)
		req.Command = tc.quoted
		viaBash := run(t, c, req)
		if d, b := sortedLines(direct.Stdout), sortedLines(viaBash.Stdout); d != b || string(direct.Stderr) != string(viaBash.Stderr) || direct.ExitCode != viaBash.ExitCode {
			t.Errorf("%q in %q: direct %d %q %q, via bash %d %q %q", tc.line, tc.cwd,
				direct.ExitCode, d, direct.Stderr, viaBash.ExitCode, b, viaBash.Stderr)
		}
	}
}

// sortedLines is b's lines sorted, without the command's marker (unique
// to each command).
func sortedLines(b []byte) string {
	lines := slices.DeleteFunc(strings.Split(string(b), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "SANDGATE_EXEC=")
	})
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
