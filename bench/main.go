// Command bench is sandgate's benchmark harness (`make bench`). It starts
// the gateway itself on loopback for each provider, runs every scenario
// against it and, where there is one, against a baseline alternately in
// the same rounds (exec of `true` vs a namespaced process or `docker
// exec`, create → exec → delete vs the docker CLI, PTY and pipe output vs
// reading the process directly, keystroke echo vs a host PTY, file
// transfer vs a host copy or `docker cp`, concurrency, the rollout
// scenario), prints a table of p50, p99 and ratios, and writes the same
// as JSON and an SVG chart under -out.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	gateway      string
	providers    []string
	scenarios    map[string]bool
	rounds, n    int
	concurrency  int
	idleSessions int
	heldCommands int
	heldFor      time.Duration
	streams      int
	streamBytes  int
	fileBytes    int64
	rollouts     map[string][]int
	out          string
	soak         time.Duration
	soakRate     int
	merge        bool
	table        bool
}

var allScenarios = []string{"exec", "lifecycle", "pty", "pipe", "echo", "concurrency", "sessions", "streams", "files", "rollout", "commands"}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.soak > 0 {
		os.Exit(runSoak(ctx, o))
	}
	if o.table {
		var rep Report
		b, err := os.ReadFile(filepath.Join(o.out, "results.json"))
		if err == nil {
			err = json.Unmarshal(b, &rep)
		}
		if err == nil {
			rep.table(os.Stdout)
			err = rep.write(o.out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	rep, err := run(ctx, o, os.Stderr)
	if rep != nil && o.merge {
		rep.mergeInto(filepath.Join(o.out, "results.json"))
	}
	if rep != nil {
		rep.table(os.Stdout)
		if werr := rep.write(o.out); werr != nil {
			fmt.Fprintln(os.Stderr, "bench:", werr)
		} else {
			fmt.Printf("\nwritten: %s/results.json, %s/results.svg\n", o.out, o.out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	o := options{}
	var providers, scenarios, localRollouts, dockerRollouts string
	var fileMiB, streamMiB int
	var quick bool
	fs.StringVar(&o.gateway, "gateway", "bin/gateway", "the gateway binary (sandgate-agent beside it)")
	fs.StringVar(&providers, "providers", "local,docker", "providers to measure")
	fs.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "scenarios to run")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds per scenario (gateway and baseline alternate in each)")
	fs.IntVar(&o.n, "n", 20, "samples per round for the latency scenarios")
	fs.IntVar(&o.concurrency, "concurrency", 200, "execs at once in the concurrency scenario")
	fs.IntVar(&o.idleSessions, "idle-sessions", 1000, "attached idle terminal sessions")
	fs.IntVar(&o.streams, "streams", 100, "sessions streaming at once")
	fs.IntVar(&o.heldCommands, "held-commands", 1000, "quiet durable commands held at once")
	fs.DurationVar(&o.heldFor, "held-for", 2*time.Minute, "how long the held commands run")
	// 32 MiB, the old default, lasted 50-90 ms a run on a pipe: the
	// start (the pipe grown, buffers sized to the stream) weighed more
	// than the rate, and so did another process's time slice.
	fs.IntVar(&streamMiB, "stream-mib", 256, "output per throughput run, in MiB (a quarter of it, at most 8 MiB, per session of the streams scenario)")
	fs.IntVar(&fileMiB, "file-mib", 1024, "file size for the transfer scenario, in MiB")
	fs.StringVar(&localRollouts, "rollouts-local", "100,500,1000", "concurrent rollouts on the local provider")
	fs.StringVar(&dockerRollouts, "rollouts-docker", "100", "concurrent rollouts on the docker provider")
	fs.StringVar(&o.out, "out", "bench/results", "directory for results.json and results.svg (with -quick: a new temporary directory unless given)")
	fs.DurationVar(&o.soak, "soak", 0, "instead of the benchmarks, a soak of this long on the local provider (make soak: 10m)")
	fs.IntVar(&o.soakRate, "soak-rate", 10, "soak operations started per second")
	fs.BoolVar(&o.merge, "merge", false, "keep the results already in -out, replacing those of the scenarios measured again (a provider or scenario re-run alone)")
	fs.BoolVar(&o.table, "table", false, "print the table of the results in -out (and redraw their chart) instead of measuring")
	fs.BoolVar(&quick, "quick", false, "small sizes and counts: checks the harness, measures little")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if quick {
		// A quick run checks the harness: its numbers are not results, so
		// they go to a directory of their own unless -out says where.
		outGiven := false
		fs.Visit(func(f *flag.Flag) { outGiven = outGiven || f.Name == "out" })
		if !outGiven {
			dir, err := os.MkdirTemp("", "sandgate-bench-quick-")
			if err != nil {
				return o, err
			}
			o.out = dir
		}
		o.rounds, o.n, o.concurrency, o.idleSessions, o.streams = 2, 3, 20, 20, 5
		o.heldCommands, o.heldFor = 20, 8*time.Second
		streamMiB, fileMiB, localRollouts, dockerRollouts = 1, 8, "5", "3"
	}
	o.streamBytes, o.fileBytes = streamMiB<<20, int64(fileMiB)<<20
	o.providers = strings.Split(providers, ",")
	o.scenarios = map[string]bool{}
	for _, s := range strings.Split(scenarios, ",") {
		if !contains(allScenarios, s) {
			return o, fmt.Errorf("unknown scenario %q (have %s)", s, strings.Join(allScenarios, ", "))
		}
		o.scenarios[s] = true
	}
	o.rollouts = map[string][]int{}
	for p, list := range map[string]string{"local": localRollouts, "docker": dockerRollouts} {
		for _, f := range strings.Split(list, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				return o, fmt.Errorf("rollout count %q", f)
			}
			o.rollouts[p] = append(o.rollouts[p], n)
		}
	}
	if o.rounds < 1 || o.n < 1 {
		return o, fmt.Errorf("-rounds and -n must be positive")
	}
	return o, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// run measures every provider in turn; the report holds what finished.
func run(ctx context.Context, o options, log *os.File) (*Report, error) {
	rep := &Report{Started: time.Now().UTC(), Machine: machine(), Rounds: o.rounds}
	for _, p := range o.providers {
		if err := runProvider(ctx, o, p, rep, log); err != nil {
			return rep, fmt.Errorf("%s: %w", p, err)
		}
	}
	return rep, nil
}

func runProvider(ctx context.Context, o options, provider string, rep *Report, log *os.File) error {
	b := &bench{o: o, create: map[string]any{}}
	if provider == "docker" {
		img, err := benchImage(ctx)
		if err != nil {
			return err
		}
		b.image, b.create["image"] = img, img
	}
	g, err := startGateway(o.gateway, provider)
	if err != nil {
		return err
	}
	defer g.stop()
	b.g = g
	step := func(name string, f func() ([]Result, error)) error {
		if !o.scenarios[name] {
			return nil
		}
		fmt.Fprintf(log, "bench: %s: %s…\n", provider, name)
		rs, err := f()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rep.Results = append(rep.Results, rs...)
		return ctx.Err()
	}
	one := func(f func(context.Context) (Result, error)) func() ([]Result, error) {
		return func() ([]Result, error) {
			r, err := f(ctx)
			return []Result{r}, err
		}
	}
	steps := []struct {
		name string
		f    func() ([]Result, error)
	}{
		{"exec", one(b.execTrue)},
		{"lifecycle", one(b.lifecycle)},
		{"pty", one(func(ctx context.Context) (Result, error) { return b.throughput(ctx, true) })},
		{"pipe", one(func(ctx context.Context) (Result, error) { return b.throughput(ctx, false) })},
		{"echo", one(b.echo)},
		{"concurrency", one(b.concurrentExecs)},
		{"sessions", one(b.idleSessions)},
		{"streams", one(b.streaming)},
		{"files", func() ([]Result, error) { return b.files(ctx) }},
		{"commands", func() ([]Result, error) {
			var rs []Result
			for _, f := range []func(context.Context) (Result, error){b.commandStart, b.commandStream, b.commandsHeld} {
				r, err := f(ctx)
				if err != nil {
					return rs, err
				}
				rs = append(rs, r)
			}
			return rs, nil
		}},
		{"rollout", func() ([]Result, error) {
			var rs []Result
			for _, n := range o.rollouts[provider] {
				r, err := b.rollout(ctx, n)
				if err != nil {
					return rs, err
				}
				rs = append(rs, r)
			}
			return rs, nil
		}},
	}
	for _, s := range steps {
		if err := step(s.name, s.f); err != nil {
			return err
		}
	}
	return nil
}

// runSoak runs the soak on the local provider and says whether it held:
// no unexpected error, no byte lost, flat memory.
func runSoak(ctx context.Context, o options) int {
	g, err := startGateway(o.gateway, "local")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer g.stop()
	res, err := soak(ctx, g, o.soak, o.soakRate, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: soak:", err)
		return 1
	}
	if err := writeSoak(res, o.out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
	for _, e := range res.Errors {
		fmt.Println("  error:", e)
	}
	if len(res.Errors) > 0 || !res.MemoryFlat {
		return 1
	}
	return 0
}

// machine describes where the run happens.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			kb, _ := strconv.ParseFloat(f[1], 64)
			mem = fmt.Sprintf(", %.0f GiB", kb/(1<<20))
		}
	}
	kernel, _ := exec.Command("uname", "-r").Output()
	return fmt.Sprintf("%d cores (%s)%s, Linux %s, %s", runtime.NumCPU(), model, mem, strings.TrimSpace(string(kernel)), runtime.Version())
}
