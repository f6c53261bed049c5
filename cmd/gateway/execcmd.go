package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/client"
)

const execUsage = "--url URL --lease TOKEN [--cwd DIR] [--timeout SECONDS] SANDBOX -- CMD [ARG...]\n       gateway exec --url URL [--key KEY] [--image IMAGE] [--keep] -- CMD [ARG...]   (in a new sandbox)"

// runExec is `gateway exec`: one command in a sandbox, its stdout and
// stderr copied to the local ones as it writes them. It runs as a durable
// command (POST .../commands) whose output is followed over the event
// stream, re-opened after a cut from the last offsets received, so a
// proxy that drops the connection, or a gateway restart, loses nothing.
// It returns the command's exit code (125 on a timeout, as the gateway
// reports it), or exitUsage / exitFailed when the command could not be
// run. An interrupt kills the command. One argument after "--" is a
// shell command line; several are quoted into one.
func runExec(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := clientFlagSet("exec", execUsage, stderr)
	var cf clientFlags
	cf.register(fs, env)
	cwd := fs.String("cwd", "", "working directory (default: the sandbox's workdir)")
	timeout := fs.Float64("timeout", 0, "seconds before the command is killed (default: the gateway's, 180)")
	cf.registerKey(fs)
	var sc scratch
	sc.define(fs)
	pos, argv, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) > 1 || len(argv) == 0 {
		fs.Usage()
		return exitUsage
	}
	if len(pos) == 0 {
		id, done, err := sc.make(ctx, &cf, "command", stderr)
		if err != nil {
			fmt.Fprintln(stderr, "gateway exec:", err)
			return exitFailed
		}
		defer done()
		pos = []string{id}
	}
	cl, err := cf.client()
	if err != nil {
		fmt.Fprintln(stderr, "gateway exec:", err)
		return exitUsage
	}
	req := api.CommandRequest{Command: argv[0]}
	if len(argv) > 1 {
		req.Command = shellQuote(argv)
	}
	if *cwd != "" {
		req.Cwd = cwd
	}
	if *timeout > 0 {
		req.TimeoutS = timeout
	}
	sig, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	var cid string // once started
	end, err := cl.RunCommand(sig, pos[0], req, client.FollowOptions{Stdout: stdout, Stderr: stderr,
		Started:      func(c api.Command) { cid = c.CommandID },
		Reconnecting: func(n int, err error) { fmt.Fprintf(stderr, "gateway exec: reconnecting (%d): %v\n", n, err) }})
	switch {
	case err != nil && cid == "":
		fmt.Fprintln(stderr, "gateway exec:", err)
		return exitFailed
	case err != nil:
		if sig.Err() != nil && ctx.Err() == nil {
			// Interrupted: the command dies with this process.
			kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			cl.DeleteCommand(kctx, pos[0], cid)
		}
		fmt.Fprintf(stderr, "gateway exec: %v (command %s)\n", err, cid)
		return exitFailed
	}
	code := exitFailed
	if end.ExitCode != nil {
		code = *end.ExitCode
	}
	if end.ErrorType != nil {
		fmt.Fprintf(stderr, "gateway exec: %s error (exit code %d)\n", *end.ErrorType, code)
	}
	if end.Truncated {
		fmt.Fprintln(stderr, "gateway exec: output was truncated at the command's output cap")
	}
	return code
}
