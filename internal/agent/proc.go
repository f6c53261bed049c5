package agent

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/sandgate/sandgate/internal/providers"
)

// shell is bash when the sandbox has it, else sh.
func shell() (string, error) {
	for _, s := range []string{"/bin/bash", "/bin/sh"} {
		if st, err := os.Stat(s); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return s, nil
		}
	}
	return "", providers.Errorf(providers.ErrInvalid, "the sandbox has neither /bin/bash nor /bin/sh")
}

// shellArgs is the argv that runs command line cmdline: bash -c, else
// sh -c; "" is an interactive login shell.
func shellArgs(cmdline string) ([]string, error) {
	sh, err := shell()
	if err != nil {
		return nil, err
	}
	if cmdline == "" {
		return []string{sh, "-l"}, nil
	}
	return []string{sh, "-c", cmdline}, nil
}

// newCommand prepares argv (its first word found in the command's PATH
// unless it names a path) as user in cwd (under root, a path prefix: see
// Options.Root), with the environment base (the sandbox's) plus env. It
// does not start it.
func newCommand(argv []string, uname, cwd, root string, env map[string]string, base []string) (*exec.Cmd, error) {
	cmd := &exec.Cmd{Args: argv, SysProcAttr: &syscall.SysProcAttr{}}
	if cwd != "" {
		cmd.Dir = root + cwd
		st, err := os.Stat(cmd.Dir)
		switch {
		case err != nil:
			return nil, providers.Errorf(providers.ErrInvalid, "working directory %s does not exist in the sandbox", cwd)
		case !st.IsDir():
			return nil, providers.Errorf(providers.ErrInvalid, "working directory %s is not a directory", cwd)
		}
	}
	vars := map[string]string{}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	if uname != "" {
		cred, home, name, err := lookupUser(uname)
		if err != nil {
			return nil, err
		}
		cmd.SysProcAttr.Credential = cred
		vars["HOME"], vars["USER"], vars["LOGNAME"] = home, name, name
	}
	for k, v := range env {
		vars[k] = v
	}
	cmd.Env = make([]string, 0, len(vars))
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	path, err := lookPath(argv[0], vars["PATH"])
	if err != nil {
		return nil, err
	}
	cmd.Path = path
	return cmd, nil
}

// DefaultPath is a command's PATH when its environment sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// lookPath finds file in path (DefaultPath if "") as the shell would, in
// the agent's view of the filesystem.
func lookPath(file, path string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil
	}
	if path == "" {
		path = DefaultPath
	}
	for _, dir := range strings.Split(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := dir + "/" + file
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", providers.Errorf(providers.ErrInvalid, "%s: command not found", file)
}

// SandboxEnv is env (a sandbox's environment) as a sorted KEY=VALUE list,
// with PATH, and root's HOME, USER and LOGNAME from the sandbox's
// /etc/passwd, filled in where env does not set them: what a command
// starts from.
func SandboxEnv(env map[string]string) []string {
	vars := map[string]string{"PATH": DefaultPath}
	if _, home, name, err := lookupUser("0"); err == nil {
		vars["HOME"], vars["USER"], vars["LOGNAME"] = home, name, name
	}
	for k, v := range env {
		vars[k] = v
	}
	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// lookupUser resolves a user name or numeric uid in the sandbox's
// /etc/passwd. A numeric uid it does not list runs with gid 0 and home /,
// as Docker does.
func lookupUser(name string) (*syscall.Credential, string, string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		u, err = user.LookupId(name)
	}
	if err != nil {
		uid, perr := strconv.ParseUint(name, 10, 32)
		if perr != nil {
			return nil, "", "", providers.Errorf(providers.ErrInvalid, "user %q does not exist in the sandbox", name)
		}
		return &syscall.Credential{Uid: uint32(uid)}, "/", name, nil
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	home := u.HomeDir
	if home == "" {
		home = "/"
	}
	return cred, home, u.Username, nil
}

// startError explains a failed start.
func startError(err error) error {
	return fmt.Errorf("start: %w", err)
}
