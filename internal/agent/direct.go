package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// A one-shot command line that is a single simple command of plain words
// is what `bash -c` runs without a shell of its own: bash parses it, finds
// the program in PATH and execs it in its own place (same pid, same
// process group). directCommand does the same without bash, which is most
// of what `true` costs (bash's start-up is ~0.7 ms, the program's ~0.8).
// The program gets the argv and environment bash would have given it:
// the words as typed, and bash's exports added (PWD, SHLVL, _: bash 5.1
// and later decrement SHLVL again before that exec). Anything bash would
// do differently stays with bash: a word with a quote, an expansion, a
// redirection, an operator or a glob; an assignment; a builtin or
// keyword; a program not found or not executable; an environment that
// changes how bash starts (BASH_ENV, exported functions, ...); a command
// run as another user (bash looks the program up with that user's
// rights); a program the kernel will not exec (a script without #!: bash
// runs it itself). Then the command goes through bash as before.

// plainWord reports whether w needs no shell processing: no quoting,
// expansion, glob, tilde, brace, comment, redirection or operator.
func plainWord(w string) bool {
	for i := 0; i < len(w); i++ {
		c := w[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("_./:,+@%=-", c) >= 0:
		default:
			return false
		}
	}
	return w != ""
}

// shellWords are bash's keywords and builtins: as a command's first word
// the shell runs them itself.
var shellWords = map[string]bool{}

func init() {
	for _, w := range strings.Fields(`if then else elif fi case esac for select while until do done in function
		time coproc . : [ alias bg bind break builtin caller cd command compgen complete compopt continue
		declare dirs disown echo enable eval exec exit export false fc fg getopts hash help history jobs
		kill let local logout mapfile popd printf pushd pwd read readarray readonly return set shift shopt
		source suspend test times trap true type typeset ulimit umask unalias unset wait`) {
		shellWords[w] = true
	}
}

// bashStartEnv are the variables that change what bash does before it
// runs a command line.
var bashStartEnv = []string{"BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "POSIXLY_CORRECT", "OLDPWD", "BASH_XTRACEFD", "PS4"}

// directCommand returns the command that runs cmdline as bash -c would,
// without bash, or nil when bash must run it. sh is cmd, the prepared
// shell command (argv bash -c cmdline, its environment, directory,
// credentials and standard files); user is the command's user ("":
// root).
func directCommand(sh *exec.Cmd, cmdline, user string) *exec.Cmd {
	if user != "" || len(sh.Args) != 3 || filepath.Base(sh.Path) != "bash" {
		return nil
	}
	words := strings.FieldsFunc(cmdline, func(r rune) bool { return r == ' ' || r == '\t' })
	if len(words) == 0 {
		return nil
	}
	for _, w := range words {
		if !plainWord(w) {
			return nil
		}
	}
	name := words[0]
	if strings.Contains(name, "=") || name[0] == '-' {
		return nil
	}
	if shellWords[name] && !((name == "true" || name == "false") && len(words) == 1) {
		// Builtins run inside bash. Alone, true and false only exit, as
		// their programs do.
		return nil
	}
	vars := make(map[string]string, len(sh.Env)+3)
	for _, kv := range sh.Env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	for _, k := range bashStartEnv {
		if _, ok := vars[k]; ok {
			return nil
		}
	}
	for k := range vars {
		if strings.HasPrefix(k, "BASH_FUNC_") {
			return nil
		}
	}
	shlvl := "0" // bash sets 1, then 0 again for the exec
	if v, ok := vars["SHLVL"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 998 || strconv.Itoa(n) != v {
			return nil
		}
		shlvl = v
	}
	path, ok := findProgram(name, vars["PATH"])
	if !ok {
		return nil
	}
	dir := sh.Dir
	if dir == "" {
		var err error
		if dir, err = os.Getwd(); err != nil {
			return nil
		}
	}
	pwd, ok := bashPWD(vars["PWD"], dir)
	if !ok {
		return nil
	}
	vars["PWD"], vars["SHLVL"], vars["_"] = pwd, shlvl, path
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	attr := *sh.SysProcAttr
	return &exec.Cmd{Path: path, Args: words, Env: env, Dir: sh.Dir, SysProcAttr: &attr,
		Stdin: sh.Stdin, Stdout: sh.Stdout, Stderr: sh.Stderr}
}

// findProgram finds name as bash does for root: a name with a slash is
// that path (absolute here: a relative one is left to bash), else the
// first executable regular file in PATH (DefaultPath if unset; every
// entry must be absolute, "." and relative ones are left to bash).
func findProgram(name, path string) (string, bool) {
	if strings.Contains(name, "/") {
		return name, filepath.IsAbs(name) && executable(name)
	}
	if path == "" {
		path = DefaultPath
	}
	for _, dir := range strings.Split(path, ":") {
		if !filepath.IsAbs(dir) {
			return "", false
		}
		if p := dir + "/" + name; executable(p) {
			return p, true
		}
	}
	return "", false
}

func executable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// bashPWD is the PWD bash exports from directory dir: the inherited one
// if it is absolute and names dir, else dir with its symbolic links
// resolved (getcwd's answer).
func bashPWD(inherited, dir string) (string, bool) {
	d, err := os.Stat(dir)
	if err != nil {
		return "", false
	}
	if filepath.IsAbs(inherited) {
		if fi, err := os.Stat(inherited); err == nil && os.SameFile(fi, d) {
			return inherited, true
		}
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil || !filepath.IsAbs(real) {
		return "", false
	}
	return real, true
}
