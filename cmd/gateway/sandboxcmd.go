package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sandgate/sandgate/internal/api"
)

// commandsUsage is what `gateway --help` (and `gateway help`) prints
// before the server's flags.
const commandsUsage = `usage: gateway [serve] [flags]          run a gateway (the default command)
       gateway COMMAND [flags] [args]     talk to a running gateway

Commands (each takes --help; all take --url, --key, --lease and their
environment twins SANDGATE_URL, SANDGATE_API_KEY, SANDGATE_LEASE):
  sandbox create   make a sandbox; prints its id and owner lease
  sandbox list     the key's sandboxes
  sandbox get      describe one sandbox
  sandbox delete   delete sandboxes
  sandbox renew    extend a sandbox's lifetime
  snapshot create  capture a sandbox's files
  snapshot list    the key's snapshots
  snapshot delete  delete a snapshot
  fork             snapshot a sandbox and make N sandboxes of it
  lease mint       mint a lease (operate by default)
  lease list       a sandbox's live leases
  lease release    revoke the --lease token and the leases minted from it
  lease revoke     revoke a lease by id
  cp               copy a file to or from a sandbox (SANDBOX:PATH; - is stdin/stdout)
  exec             run a command (in a new sandbox when none is named)
  shell            an interactive terminal (in a new sandbox when none is named)
  healthcheck      exit 0 when a gateway is ready (for container health checks)

Commands that print take --json for scripts: the gateway's JSON answer.
`

// cliCommand is one client subcommand: it parses args with the flags
// every command has and runs against the gateway.
type cliCommand struct {
	name, usage string
	// min and max bound the positional arguments (max -1: any number);
	// runCLI checks them before run.
	min, max int
	run      func(ctx context.Context, cc *cli, pos []string) error
	// flags adds the command's own flags.
	flags func(fs *flag.FlagSet)
}

// cli is one run of a client subcommand.
type cli struct {
	cf     clientFlags
	json   bool
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// usageError makes the command print its usage and exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// runCLI runs the subcommand args[0] (with args[1] when it is a group such
// as `sandbox create`); handled is false for anything else.
func runCLI(ctx context.Context, args []string, env func(string) (string, bool), stdin io.Reader, stdout, stderr io.Writer) (code int, handled bool) {
	if len(args) == 0 {
		return 0, false
	}
	if args[0] == "help" {
		fmt.Fprint(stdout, commandsUsage)
		return 0, true
	}
	name, rest := args[0], args[1:]
	if groups[name] {
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			fmt.Fprintf(stderr, "usage: gateway %s SUBCOMMAND; see gateway help\n", name)
			return exitUsage, true
		}
		name, rest = name+" "+rest[0], rest[1:]
	}
	cmd, ok := cliCommands[name]
	if !ok {
		if groups[args[0]] {
			fmt.Fprintf(stderr, "gateway: unknown command %q; see gateway help\n", name)
			return exitUsage, true
		}
		return 0, false
	}
	fs := clientFlagSet(name, cmd.usage, stderr)
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	c.cf.register(fs, env)
	c.cf.registerKey(fs)
	fs.BoolVar(&c.json, "json", false, "print the gateway's JSON answer")
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	pos, more, err := parseInterleaved(fs, rest)
	if err != nil {
		return exitUsage, true
	}
	pos = append(pos, more...)
	if len(pos) < cmd.min || (cmd.max >= 0 && len(pos) > cmd.max) {
		err = usageError{}
	} else {
		err = cmd.run(ctx, c, pos)
	}
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			if ue.msg != "" {
				fmt.Fprintf(stderr, "gateway %s: %s\n", name, ue.msg)
			}
			fs.Usage()
			return exitUsage, true
		}
		fmt.Fprintf(stderr, "gateway %s: %v\n", name, err)
		return exitFailed, true
	}
	return 0, true
}

var groups = map[string]bool{"sandbox": true, "snapshot": true, "lease": true}

// print writes v as JSON under --json, else calls human.
func (c *cli) print(v any, human func(w io.Writer)) error {
	if c.json {
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	human(c.stdout)
	return nil
}

// keyValues parses repeated K=V flags.
type keyValues map[string]string

func (kv *keyValues) String() string { return "" }

func (kv *keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	if *kv == nil {
		*kv = keyValues{}
	}
	(*kv)[k] = v
	return nil
}

// optionalFloat is a float flag that knows whether it was given.
type optionalFloat struct{ v *float64 }

func (o *optionalFloat) String() string {
	if o.v == nil {
		return ""
	}
	return fmt.Sprint(*o.v)
}

func (o *optionalFloat) Set(s string) error {
	var f float64
	if _, err := fmt.Sscan(s, &f); err != nil {
		return fmt.Errorf("want a number of seconds, got %q", s)
	}
	o.v = &f
	return nil
}

// createFlags are the flags of every command that may make a sandbox.
type createFlags struct {
	image, workdir, spec string
	ttl                  optionalFloat
	env, labels          keyValues
}

func (f *createFlags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.image, "image", "", "image of the sandbox (docker, kubernetes: required; local: a name under --local-images, or the host view)")
	fs.StringVar(&f.workdir, "workdir", "", "working directory")
	fs.Var(&f.ttl, "ttl", "lifetime in seconds (default: the gateway's, 1800; 0: no expiry)")
	fs.Var(&f.env, "env", "KEY=VALUE in every process's environment (repeatable)")
	fs.Var(&f.labels, "label", "KEY=VALUE metadata, the list's --label filter (repeatable)")
	fs.StringVar(&f.spec, "spec", "", "the whole create request as JSON, or @FILE holding it; the other flags override its fields")
}

// request is the create request the flags describe.
func (f *createFlags) request() (api.CreateSandbox, error) {
	var req api.CreateSandbox
	if f.spec != "" {
		b := []byte(f.spec)
		if name, ok := strings.CutPrefix(f.spec, "@"); ok {
			var err error
			if b, err = os.ReadFile(name); err != nil {
				return req, err
			}
		}
		if err := json.Unmarshal(b, &req); err != nil {
			return req, fmt.Errorf("--spec: %w", err)
		}
	}
	if f.image != "" {
		req.Image = &f.image
	}
	if f.workdir != "" {
		req.Workdir = &f.workdir
	}
	if f.ttl.v != nil {
		req.TTLS = f.ttl.v
	}
	if len(f.env) > 0 {
		req.Env = f.env
	}
	if len(f.labels) > 0 {
		req.Metadata = f.labels
	}
	return req, nil
}

var createOpts createFlags

var cliCommands = map[string]cliCommand{
	"sandbox create": {
		usage: "[--image IMAGE] [--ttl SECONDS] [--env K=V]... [--label K=V]... [--spec JSON|@FILE] [--json]",
		min:   0, max: 0,
		flags: createOpts.define,
		run: func(ctx context.Context, c *cli, pos []string) error {
			req, err := createOpts.request()
			if err != nil {
				return usageError{err.Error()}
			}
			kc, err := c.cf.keyClient()
			if err != nil {
				return err
			}
			ref, err := kc.CreateSandbox(ctx, req)
			if err != nil {
				return err
			}
			return c.print(ref, func(w io.Writer) {
				fmt.Fprintf(w, "sandbox: %s\nlease:   %s\n", ref.SandboxID, ref.LeaseToken)
			})
		},
	},
	"sandbox list": {
		usage: "[--status STATUS] [--label K=V] [--json]",
		min:   0, max: 0,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&listFilter.status, "status", "", "only sandboxes in this status (running, paused, ...)")
			fs.StringVar(&listFilter.label, "label", "", "only sandboxes with this K=V metadata")
		},
		run: func(ctx context.Context, c *cli, pos []string) error {
			kc, err := c.cf.keyClient()
			if err != nil {
				return err
			}
			list, err := kc.Sandboxes(ctx, listFilter.status, listFilter.label)
			if err != nil {
				return err
			}
			return c.print(api.SandboxList{Sandboxes: list}, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SANDBOX\tSTATUS\tPROVIDER\tCREATED\tEXPIRES")
				for _, s := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.SandboxID, s.Status, s.ProviderName, s.CreatedAt.Format(time.RFC3339), expires(s.ExpiresAt))
				}
				tw.Flush()
			})
		},
	},
	"sandbox get": {
		usage: "[--json] SANDBOX",
		min:   1, max: 1,
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			s, err := sc.Sandbox(ctx, pos[0])
			if err != nil {
				return err
			}
			return c.print(s, func(w io.Writer) {
				fmt.Fprintf(w, "sandbox:  %s\nstatus:   %s\nprovider: %s\nworkdir:  %s\ncreated:  %s\nexpires:  %s\n",
					s.SandboxID, s.Status, s.ProviderName, s.Workdir, s.CreatedAt.Format(time.RFC3339), expires(s.ExpiresAt))
				for _, k := range sortedKeys(s.Metadata) {
					fmt.Fprintf(w, "label:    %s=%s\n", k, s.Metadata[k])
				}
			})
		},
	},
	"sandbox delete": {
		usage: "[--json] SANDBOX...",
		min:   1, max: -1,
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			results := map[string]api.DeleteResult{}
			var done, failed []string
			for _, id := range pos {
				if _, seen := results[id]; seen {
					continue
				}
				res, err := sc.DeleteSandbox(ctx, id)
				if err != nil {
					fmt.Fprintf(c.stderr, "gateway sandbox delete: %s: %v\n", id, err)
					failed = append(failed, id)
					continue
				}
				results[id] = res
				done = append(done, id)
			}
			if err := c.print(results, func(w io.Writer) {
				for _, id := range done {
					if results[id].Deleted {
						fmt.Fprintf(w, "deleted %s\n", id)
					} else {
						fmt.Fprintf(w, "%s was already gone\n", id)
					}
				}
			}); err != nil {
				return err
			}
			if len(failed) > 0 {
				return fmt.Errorf("not deleted: %s", strings.Join(failed, " "))
			}
			return nil
		},
	},
	"sandbox renew": {
		usage: "[--ttl SECONDS] [--json] SANDBOX",
		min:   1, max: 1,
		flags: func(fs *flag.FlagSet) {
			fs.Var(&renewTTL, "ttl", "seconds from now (default: the sandbox's own ttl_s; 0: no expiry)")
		},
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			s, err := sc.RenewSandbox(ctx, pos[0], renewTTL.v)
			if err != nil {
				return err
			}
			return c.print(s, func(w io.Writer) { fmt.Fprintf(w, "%s expires %s\n", s.SandboxID, expires(s.ExpiresAt)) })
		},
	},
	"snapshot create": {
		usage: "[--name NAME] [--json] SANDBOX",
		min:   1, max: 1,
		flags: func(fs *flag.FlagSet) { fs.StringVar(&snapshotName, "name", "", "a name to remember it by") },
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			var req api.SnapshotRequest
			if snapshotName != "" {
				req.Name = &snapshotName
			}
			s, err := sc.Snapshot(ctx, pos[0], req)
			if err != nil {
				return err
			}
			return c.print(s, func(w io.Writer) { fmt.Fprintln(w, s.SnapshotID) })
		},
	},
	"snapshot list": {
		usage: "[--json]",
		min:   0, max: 0,
		run: func(ctx context.Context, c *cli, pos []string) error {
			kc, err := c.cf.keyClient()
			if err != nil {
				return err
			}
			list, err := kc.Snapshots(ctx)
			if err != nil {
				return err
			}
			return c.print(api.SnapshotList{Snapshots: list}, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SNAPSHOT\tSANDBOX\tNAME\tBYTES\tCREATED")
				for _, s := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", s.SnapshotID, s.SandboxID, s.Name, s.SizeBytes, s.CreatedAt.Format(time.RFC3339))
				}
				tw.Flush()
			})
		},
	},
	"snapshot delete": {
		usage: "[--json] SNAPSHOT",
		min:   1, max: 1,
		run: func(ctx context.Context, c *cli, pos []string) error {
			kc, err := c.cf.keyClient()
			if err != nil {
				return err
			}
			res, err := kc.DeleteSnapshot(ctx, pos[0])
			if err != nil {
				return err
			}
			return c.print(res, func(w io.Writer) {
				switch {
				case res.Deferred != nil && *res.Deferred:
					fmt.Fprintf(w, "%s is deleted when the last sandbox made from it ends\n", pos[0])
				case res.Deleted:
					fmt.Fprintf(w, "deleted %s\n", pos[0])
				default:
					fmt.Fprintf(w, "%s was already gone\n", pos[0])
				}
			})
		},
	},
	"fork": {
		usage: "[--count N] [--json] SANDBOX",
		min:   1, max: 1,
		flags: func(fs *flag.FlagSet) { fs.IntVar(&forkCount, "count", 1, "how many sandboxes (1 to 64)") },
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			refs, err := sc.Fork(ctx, pos[0], forkCount)
			if err != nil {
				return err
			}
			return c.print(api.ForkResult{Sandboxes: refs}, func(w io.Writer) {
				for _, r := range refs {
					fmt.Fprintf(w, "%s %s\n", r.SandboxID, r.LeaseToken)
				}
			})
		},
	},
	"lease mint": {
		usage: "[--scope operate|owner] [--ttl SECONDS] [--json] SANDBOX",
		min:   1, max: 1,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&mintScope, "scope", "operate", "operate (exec, files, terminals) or owner (everything)")
			fs.Var(&mintTTL, "ttl", "lifetime in seconds (default: as long as the sandbox and the calling lease)")
		},
		run: func(ctx context.Context, c *cli, pos []string) error {
			if mintScope != "operate" && mintScope != "owner" {
				return usageError{fmt.Sprintf("--scope %q: want operate or owner", mintScope)}
			}
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			scope := api.LeaseScope(mintScope)
			ref, err := sc.MintLease(ctx, pos[0], api.LeaseRequest{Scope: &scope, TTLS: mintTTL.v})
			if err != nil {
				return err
			}
			return c.print(ref, func(w io.Writer) { fmt.Fprintln(w, ref.LeaseToken) })
		},
	},
	"lease list": {
		usage: "[--json] SANDBOX",
		min:   1, max: 1,
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			list, err := sc.Leases(ctx, pos[0])
			if err != nil {
				return err
			}
			return c.print(api.LeaseList{Leases: list}, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "LEASE\tSCOPE\tPARENT\tEXPIRES")
				for _, l := range list {
					parent := "-"
					if l.ParentID != nil {
						parent = *l.ParentID
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", l.LeaseID, l.Scope, parent, expires(l.ExpiresAt))
				}
				tw.Flush()
			})
		},
	},
	"lease release": {
		usage: "--lease TOKEN [--json] SANDBOX",
		min:   1, max: 1,
		run: func(ctx context.Context, c *cli, pos []string) error {
			if c.cf.leaseToken() == "" {
				return usageError{"give the lease to release with --lease or SANDGATE_LEASE"}
			}
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			res, err := sc.ReleaseLease(ctx, pos[0])
			if err != nil {
				return err
			}
			return c.print(res, func(w io.Writer) {
				fmt.Fprintf(w, "released; %d leases of %s remain\n", res.RemainingLeases, pos[0])
			})
		},
	},
	"lease revoke": {
		usage: "[--json] SANDBOX LEASE_ID",
		min:   2, max: 2,
		run: func(ctx context.Context, c *cli, pos []string) error {
			sc, err := c.cf.client()
			if err != nil {
				return err
			}
			res, err := sc.RevokeLease(ctx, pos[0], pos[1])
			if err != nil {
				return err
			}
			return c.print(res, func(w io.Writer) { fmt.Fprintf(w, "revoked %d leases\n", res.Revoked) })
		},
	},
	"cp": {
		usage: "[--json] SRC DST  (one of them SANDBOX:PATH; a local - is stdin or stdout)",
		min:   2, max: 2,
		run: runCp,
	},
}

// The commands' own flag values (one command runs per process).
var (
	listFilter   struct{ status, label string }
	renewTTL     optionalFloat
	snapshotName string
	forkCount    int
	mintScope    string
	mintTTL      optionalFloat
)

// runCp copies one file between the local machine and a sandbox, streamed
// both ways (PUT and GET …/files).
func runCp(ctx context.Context, c *cli, pos []string) error {
	srcID, srcPath, srcRemote := remotePath(pos[0])
	dstID, dstPath, dstRemote := remotePath(pos[1])
	if srcRemote == dstRemote {
		return usageError{"exactly one of SRC and DST is SANDBOX:PATH"}
	}
	sc, err := c.cf.client()
	if err != nil {
		return err
	}
	if dstRemote {
		var in io.Reader = c.stdin
		if srcPath != "-" {
			f, err := os.Open(srcPath)
			if err != nil {
				return err
			}
			defer f.Close()
			in = f
		}
		res, err := sc.PutFile(ctx, dstID, dstPath, in)
		if err != nil {
			return fmt.Errorf("%s:%s: %w", dstID, dstPath, err)
		}
		if c.json {
			return c.print(res, nil)
		}
		if srcPath != "-" {
			fmt.Fprintf(c.stderr, "%d bytes to %s:%s\n", res.Size, dstID, res.Path)
		}
		return nil
	}
	body, _, err := sc.GetFile(ctx, srcID, srcPath)
	if err != nil {
		return fmt.Errorf("%s:%s: %w", srcID, srcPath, err)
	}
	defer body.Close()
	if dstPath == "-" {
		_, err = io.Copy(c.stdout, body)
		return err
	}
	if st, err := os.Stat(dstPath); err == nil && st.IsDir() {
		dstPath = strings.TrimSuffix(dstPath, "/") + "/" + srcPath[strings.LastIndexByte(srcPath, '/')+1:]
	}
	// Written beside the target and renamed, so a broken download never
	// leaves a partial file under the name asked for.
	f, err := os.CreateTemp(dirOf(dstPath), ".sandgate-cp-*")
	if err != nil {
		return err
	}
	n, err := io.Copy(f, body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), dstPath)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	if c.json {
		return c.print(api.FileWritten{Path: dstPath, Size: n}, nil)
	}
	fmt.Fprintf(c.stderr, "%d bytes to %s\n", n, dstPath)
	return nil
}

// remotePath splits SANDBOX:PATH. A local path that holds a colon can be
// given as ./a:b.
func remotePath(s string) (id, path string, remote bool) {
	id, path, ok := strings.Cut(s, ":")
	if !ok || id == "" || strings.ContainsAny(id, "/.") {
		return "", s, false
	}
	return id, path, true
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[:i+1]
	}
	return "."
}

func expires(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return t.Format(time.RFC3339)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// scratch is a sandbox that `exec` or `shell` made because none was named:
// deleted when the command ends, unless kept.
type scratch struct {
	create createFlags
	keep   bool
}

func (s *scratch) define(fs *flag.FlagSet) {
	s.create.define(fs)
	fs.BoolVar(&s.keep, "keep", false, "when no SANDBOX is named: keep the sandbox made for the command (default: delete it at the end)")
}

// make creates the sandbox and switches cf to its owner lease. The
// returned func deletes it (unless --keep, when it says how to come back).
func (s *scratch) make(ctx context.Context, cf *clientFlags, name string, stderr io.Writer) (id string, done func(), err error) {
	req, err := s.create.request()
	if err != nil {
		return "", nil, err
	}
	kc, err := cf.keyClient()
	if err != nil {
		return "", nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	ref, err := kc.CreateSandbox(cctx, req)
	if err != nil {
		return "", nil, fmt.Errorf("create a sandbox: %w", err)
	}
	cf.lease = ref.LeaseToken
	if s.keep {
		fmt.Fprintf(stderr, "sandgate: made sandbox %s; it is kept (SANDGATE_LEASE=%s)\n", ref.SandboxID, ref.LeaseToken)
		return ref.SandboxID, func() {}, nil
	}
	fmt.Fprintf(stderr, "sandgate: made sandbox %s for this %s; it is deleted at the end (--keep keeps it)\n", ref.SandboxID, name)
	return ref.SandboxID, func() {
		sc, err := cf.client()
		if err == nil {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = sc.DeleteSandbox(dctx, ref.SandboxID)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sandgate: delete sandbox %s: %v\n", ref.SandboxID, err)
		}
	}, nil
}
