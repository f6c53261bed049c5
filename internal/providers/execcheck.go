package providers

import (
	"path"
	"strings"
)

// MaxCommand is Linux's limit on one argument string (MAX_ARG_STRLEN),
// less room for the shell's other arguments: a command runs as bash -c
// <command>.
const MaxCommand = 128<<10 - 1024

// Check validates r as every provider takes it and fills its defaults:
// a command that fits one argument and holds no NUL, a timeout that is
// not negative (0: DefaultExecTimeout), MaxOutput (<= 0:
// DefaultMaxOutput), an absolute cwd (cleaned) and a valid environment.
// A bad request is ErrInvalid.
func (r ExecRequest) Check() (ExecRequest, error) {
	switch {
	case len(r.Command) > MaxCommand:
		return r, Errorf(ErrInvalid, "command is %d bytes; at most %d fit in one argument", len(r.Command), MaxCommand)
	case strings.ContainsRune(r.Command, 0):
		return r, Errorf(ErrInvalid, "command contains a NUL byte")
	case r.Timeout < 0:
		return r, Errorf(ErrInvalid, "timeout must be positive")
	}
	if r.Timeout == 0 {
		r.Timeout = DefaultExecTimeout
	}
	if r.MaxOutput <= 0 {
		r.MaxOutput = DefaultMaxOutput
	}
	if r.Cwd != "" {
		if !path.IsAbs(r.Cwd) {
			return r, Errorf(ErrInvalid, "cwd must be absolute")
		}
		r.Cwd = path.Clean(r.Cwd)
	}
	return r, CheckEnv(r.Env)
}

// CheckEnv is ErrInvalid for an environment variable a process cannot
// hold: an empty name, a name with '=' or NUL, a value with NUL.
func CheckEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return Errorf(ErrInvalid, "invalid environment variable %q", k)
		}
	}
	return nil
}
