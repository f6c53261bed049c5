package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sandgate/sandgate/internal/client"
)

// Exit statuses of the client subcommands when there is no remote status
// to pass on (as ssh does: 255 for its own failures).
const (
	exitUsage  = 2
	exitFailed = 255
)

// runClientCommand runs `gateway shell` and `gateway exec`, which talk to
// a gateway rather than serve one. It reports false for every other
// command line (serve, the default).
func runClientCommand(args []string) (code int, handled bool) {
	if len(args) == 0 {
		return 0, false
	}
	switch args[0] {
	case "shell":
		return runShell(context.Background(), args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr), true
	case "exec":
		return runExec(context.Background(), args[1:], os.LookupEnv, os.Stdout, os.Stderr), true
	case "-h", "-help", "--help":
		if len(args) == 1 {
			// The server's flags follow the commands (parseConfig).
			return 0, false
		}
	}
	return runCLI(context.Background(), args, os.LookupEnv, os.Stdin, os.Stdout, os.Stderr)
}

// clientFlags are the flags every client subcommand has. Their
// environment twins are read after parsing, never as flag defaults, so
// that a usage text never prints a token.
type clientFlags struct {
	url, lease, key string
	env             func(string) (string, bool)
}

func (c *clientFlags) register(fs *flag.FlagSet, env func(string) (string, bool)) {
	c.env = env
	fs.StringVar(&c.url, "url", "", "gateway URL, e.g. http://127.0.0.1:8080 (default: env SANDGATE_URL)")
	fs.StringVar(&c.lease, "lease", "", "lease token of the sandbox, or an API key that created it (default: env SANDGATE_LEASE)")
}

// registerKey adds --key, for the commands that create or list.
func (c *clientFlags) registerKey(fs *flag.FlagSet) {
	fs.StringVar(&c.key, "key", "", "API key, to create and list (default: env SANDGATE_API_KEY; none on a loopback gateway without keys)")
}

func (c *clientFlags) fill() error {
	for _, f := range []struct {
		v   *string
		env string
	}{{&c.url, "SANDGATE_URL"}, {&c.lease, "SANDGATE_LEASE"}, {&c.key, "SANDGATE_API_KEY"}} {
		if *f.v == "" {
			*f.v, _ = c.env(f.env)
		}
	}
	if c.url == "" {
		return errors.New("no gateway URL: give --url or set SANDGATE_URL")
	}
	return nil
}

// leaseToken is the lease the flags or the environment give.
func (c *clientFlags) leaseToken() string {
	if c.lease == "" {
		c.lease, _ = c.env("SANDGATE_LEASE")
	}
	return c.lease
}

// client is a client of one sandbox: it authenticates with the lease, or
// with the API key that created the sandbox.
func (c *clientFlags) client() (*client.Client, error) {
	if err := c.fill(); err != nil {
		return nil, err
	}
	token := c.lease
	if token == "" {
		token = c.key
	}
	if token == "" {
		return nil, errors.New("no lease: give --lease or set SANDGATE_LEASE (or the API key that made the sandbox: --key, SANDGATE_API_KEY)")
	}
	return client.New(c.url, token, nil)
}

// keyClient authenticates with the API key; without one it is anonymous,
// which a gateway on loopback with no keys accepts.
func (c *clientFlags) keyClient() (*client.Client, error) {
	if err := c.fill(); err != nil {
		return nil, err
	}
	return client.New(c.url, c.key, nil)
}

// parseInterleaved parses flags that may come before or after the
// positional arguments; everything after a "--" is positional as is. It
// returns the positional arguments and those after "--" apart.
func parseInterleaved(fs *flag.FlagSet, args []string) (pos, rest []string, err error) {
	for i, a := range args {
		if a == "--" {
			args, rest = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, err
		}
		if fs.NArg() == 0 {
			return pos, rest, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func clientFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gateway "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: gateway %s %s\n", name, usage)
		fs.PrintDefaults()
	}
	return fs
}

// shellQuote joins argv into one sh command line that runs exactly argv.
func shellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
