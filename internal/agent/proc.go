package agent

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
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

// newCommand prepares command line cmdline (run by bash -c, else sh -c;
// "" = an interactive login shell) as user in cwd (under root, a path
// prefix: see Options.Root), with the environment base (the sandbox's)
// plus env. It does not start it.
func newCommand(cmdline, uname, cwd, root string, env map[string]string, base []string) (*exec.Cmd, error) {
	sh, err := shell()
	if err != nil {
		return nil, err
	}
	args := []string{sh, "-c", cmdline}
	if cmdline == "" {
		args = []string{sh, "-l"}
	}
	cmd := &exec.Cmd{Path: sh, Args: args, SysProcAttr: &syscall.SysProcAttr{}}
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
	return cmd, nil
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
