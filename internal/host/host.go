// Package host reads what the machine the gateway runs on can hold: its
// memory, CPUs, task limit and disk. The figures are the defaults of the
// operator's ceilings and of the local provider's limits; with a remote
// backend (a docker daemon elsewhere, a cluster) they describe the
// gateway's machine, not the sandboxes'.
package host

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MemoryMiB is the host's total memory (MemTotal of /proc/meminfo) in MiB.
func MemoryMiB() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil || kb <= 0 {
			return 0, fmt.Errorf("/proc/meminfo: bad MemTotal %q", rest)
		}
		return kb >> 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/meminfo has no MemTotal")
}

// CPUs is how many CPUs the gateway may run on (its affinity mask).
func CPUs() int { return runtime.NumCPU() }

// DiskGiB is the size of the filesystem holding dir, in GiB.
func DiskGiB(dir string) (float64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return float64(fs.Blocks) * float64(fs.Bsize) / (1 << 30), nil
}

// FreeDiskGiB is the space an unprivileged writer can still use on the
// filesystem holding dir, in GiB.
func FreeDiskGiB(dir string) (float64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return float64(fs.Bavail) * float64(fs.Bsize) / (1 << 30), nil
}

// Procs is how many tasks the host can have: the smaller of the kernel's
// pid_max and threads-max (32768 where unreadable).
func Procs() int64 {
	n := int64(32768)
	if v, ok := readProcInt("/proc/sys/kernel/pid_max"); ok {
		n = v
	}
	if v, ok := readProcInt("/proc/sys/kernel/threads-max"); ok {
		n = min(n, v)
	}
	return n
}

// DefaultPidsMax is one sandbox's process limit on a host that can have
// procs tasks, when the operator sets none: a sixteenth of them, at least
// 64 and at most 4096 (a host with pid_max 4194304 would otherwise let
// one sandbox have 262144, which is no limit at all: its memory limit
// would be hit first).
func DefaultPidsMax(procs int64) int64 {
	return min(max(procs/16, 64), 4096)
}

// readProcInt reads a positive integer from a /proc file.
func readProcInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil && v > 0
}
