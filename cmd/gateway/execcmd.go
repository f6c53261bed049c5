package main

import (
	"context"
	"fmt"
	"io"
	"os/signal"
	"syscall"

	"github.com/sandgate/sandgate/internal/api"
)

const execUsage = "--url URL --lease TOKEN [--cwd DIR] [--timeout SECONDS] SANDBOX -- CMD [ARG...]"

// runExec is `gateway exec`: one command in a sandbox (POST .../exec), its
// stdout and stderr copied to the local ones. It returns the command's
// return_code (125 on a timeout, as the gateway reports it), or exitUsage
// / exitFailed when the command could not be run. One argument after
// "--" is a shell command line; several are quoted into one.
func runExec(ctx context.Context, args []string, env func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := clientFlagSet("exec", execUsage, stderr)
	var cf clientFlags
	cf.register(fs, env)
	cwd := fs.String("cwd", "", "working directory (default: the sandbox's workdir)")
	timeout := fs.Float64("timeout", 0, "seconds before the command is killed (default: the gateway's, 180)")
	pos, argv, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) != 1 || len(argv) == 0 {
		fs.Usage()
		return exitUsage
	}
	cl, err := cf.client()
	if err != nil {
		fmt.Fprintln(stderr, "gateway exec:", err)
		return exitUsage
	}
	req := api.ExecRequest{Command: argv[0]}
	if len(argv) > 1 {
		req.Command = shellQuote(argv)
	}
	if *cwd != "" {
		req.Cwd = cwd
	}
	if *timeout > 0 {
		req.TimeoutS = timeout
	}
	// An interrupt cancels the request, which cancels the command.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	res, err := cl.Exec(ctx, pos[0], req)
	if err != nil {
		fmt.Fprintln(stderr, "gateway exec:", err)
		return exitFailed
	}
	io.WriteString(stdout, res.Stdout)
	io.WriteString(stderr, res.Stderr)
	if res.ErrorType != nil {
		fmt.Fprintf(stderr, "gateway exec: %s error (return code %d)\n", *res.ErrorType, res.ReturnCode)
	}
	if res.Truncated {
		fmt.Fprintln(stderr, "gateway exec: output was truncated by the gateway")
	}
	return res.ReturnCode
}
