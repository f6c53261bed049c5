package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/host"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// ceilingFlags are the operator's ceilings on what one request may ask for,
// as the flags give them (see sandbox.Ceilings). 0 is no ceiling. The
// resource ceilings default to the host's figures, read at start-up by
// resolve.
type ceilingFlags struct {
	MemoryMiB, CPU, DiskGiB, Pids hostFigure
	TTL                           time.Duration
	EnvBytes, MetadataBytes       int
	FilesBytes, Files             int
}

// define adds the ceiling flags to fs, bound to c.
func (c *ceilingFlags) define(fs *flag.FlagSet) {
	c.MemoryMiB.whole, c.Pids.whole = true, true
	fs.Var(&c.MemoryMiB, "max-memory-mib", "ceiling on a create's resources.memory_mib, above it 400 (0 = none; host: the host's total memory)")
	fs.Var(&c.CPU, "max-cpu", "ceiling on a create's resources.cpu (0 = none; host: the CPUs the gateway may run on)")
	fs.Var(&c.DiskGiB, "max-disk-gib", "ceiling on a create's resources.disk_gib (0 = none; host: the free space of the state dir's filesystem at start-up, in whole GiB)")
	fs.Var(&c.Pids, "max-pids", "ceiling on a sandbox's process limit: docker's provider_options.pids_limit, and --pids-max must be within it; never above the host's pid_max or threads-max (0 = none but those; host: 1/16 of them within 64..4096, the local provider's default limit)")
	fs.DurationVar(&c.TTL, "max-ttl", 24*time.Hour, "ceiling on ttl_s of a create, a renew and a minted lease; under one, ttl_s 0 (no expiry) is refused and --default-ttl must be within it (0 = none)")
	fs.IntVar(&c.EnvBytes, "max-env-bytes", 64<<10, "ceiling on a create's env: the bytes of all its names and values (0 = none)")
	fs.IntVar(&c.MetadataBytes, "max-metadata-bytes", 64<<10, "ceiling on a create's metadata: the bytes of all its keys and values (0 = none)")
	fs.IntVar(&c.FilesBytes, "max-files-bytes", 16<<20, "ceiling on a create's files: the bytes of all their paths and contents (0 = none)")
	fs.IntVar(&c.Files, "max-files-count", 1024, "ceiling on the number of a create's files, each one write before create returns (0 = none)")
}

// resolve returns the ceilings the service applies and the process
// ceiling (0: none but the host's), with the host's figures where a flag
// says "host". stateDir must exist. pidsMax (--pids-max) must be within
// the process ceiling.
func (c ceilingFlags) resolve(stateDir string, pidsMax int64) (sandbox.Ceilings, int64, error) {
	var bad []error
	for _, f := range []struct {
		name string
		v    int
	}{{"--max-env-bytes", c.EnvBytes}, {"--max-metadata-bytes", c.MetadataBytes}, {"--max-files-bytes", c.FilesBytes}, {"--max-files-count", c.Files}} {
		if f.v < 0 {
			bad = append(bad, fmt.Errorf("%s must not be negative", f.name))
		}
	}
	if c.TTL < 0 {
		bad = append(bad, errors.New("--max-ttl must not be negative"))
	}
	out := sandbox.Ceilings{TTL: c.TTL, EnvBytes: c.EnvBytes, MetadataBytes: c.MetadataBytes, FilesBytes: c.FilesBytes, Files: c.Files}
	mem, err := c.MemoryMiB.or(func() (float64, error) {
		n, err := host.MemoryMiB()
		return float64(n), err
	})
	if err != nil {
		bad = append(bad, fmt.Errorf("--max-memory-mib: the host's memory: %w (set the flag)", err))
	}
	out.MemoryMiB = int64(mem)
	out.CPU, _ = c.CPU.or(func() (float64, error) { return float64(host.CPUs()), nil })
	out.DiskGiB, err = c.DiskGiB.or(func() (float64, error) {
		free, err := host.FreeDiskGiB(stateDir)
		// Whole GiB, and at least 1: a full disk must not read as "no
		// ceiling".
		return max(1, math.Floor(free)), err
	})
	if err != nil {
		bad = append(bad, fmt.Errorf("--max-disk-gib: the state dir's free space: %w (set the flag)", err))
	}
	procs := host.Procs()
	pids, _ := c.Pids.or(func() (float64, error) { return float64(host.DefaultPidsMax(procs)), nil })
	maxPids := int64(pids)
	if maxPids <= 0 || maxPids > procs {
		maxPids = procs // more than the host can have limits nothing
	}
	if pidsMax > maxPids {
		bad = append(bad, fmt.Errorf("--pids-max %d is over the process ceiling of %d (--max-pids, the host's pid_max and threads-max)", pidsMax, maxPids))
	}
	return out, maxPids, errors.Join(bad...)
}

// hostFigure is a ceiling flag whose default, "host", is a figure of the
// host read at start-up; any other value is a number, 0 = no ceiling.
type hostFigure struct {
	v     float64
	set   bool // false: "host"
	whole bool // only integers
}

func (h *hostFigure) String() string {
	if h == nil || !h.set {
		return "host"
	}
	return strconv.FormatFloat(h.v, 'g', -1, 64)
}

func (h *hostFigure) Set(s string) error {
	if s == "host" {
		h.set = false
		return nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || !(v >= 0) || v > 1<<50 || (h.whole && v != math.Trunc(v)) {
		what := "a number"
		if h.whole {
			what = "a whole number"
		}
		return fmt.Errorf("want %s, 0 for no ceiling, or host", what)
	}
	h.v, h.set = v, true
	return nil
}

// or is the flag's value, or read's when the flag says "host".
func (h hostFigure) or(read func() (float64, error)) (float64, error) {
	if h.set {
		return h.v, nil
	}
	return read()
}
