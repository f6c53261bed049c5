package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// Cgroup v1 handling. Each sandbox gets one cgroup per controller, named
// sandgate-<id>, created under the gateway's own cgroup of that hierarchy
// (for memory that nests the sandbox's limit inside the gateway's). Init is
// moved in before the first command; commands inherit.

const (
	cgroupRoot     = "/sys/fs/cgroup"
	cgroupPrefix   = "sandgate-"
	defaultPidsMax = 4096
	cfsPeriod      = 100000 // µs
)

var cgroupControllers = []string{"memory", "cpu", "pids", "freezer"}

// ownCgroups maps each v1 controller to the gateway's cgroup path in it.
func ownCgroups() map[string]string {
	out := make(map[string]string)
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// cgroupLimits are the files to write in each controller's cgroup.
func cgroupLimits(res providers.Resources) map[string][][2]string {
	lim := map[string][][2]string{
		"pids": {{"pids.max", strconv.Itoa(defaultPidsMax)}},
	}
	if res.MemoryMiB != nil {
		b := strconv.FormatInt(*res.MemoryMiB<<20, 10)
		// memsw must not go below the plain limit, so it is written second;
		// it is absent without swap accounting, which is fine.
		lim["memory"] = [][2]string{{"memory.limit_in_bytes", b}, {"memory.memsw.limit_in_bytes?", b}}
	}
	if res.CPU != nil {
		q := int64(*res.CPU * cfsPeriod)
		lim["cpu"] = [][2]string{{"cpu.cfs_period_us", strconv.Itoa(cfsPeriod)}, {"cpu.cfs_quota_us", strconv.FormatInt(q, 10)}}
	}
	return lim
}

// setupCgroups creates the sandbox's cgroups, writes res into them and
// moves pid in. A hierarchy the gateway cannot write to is skipped (the
// returned map lacks it); a memory limit then falls back to RLIMIT_AS on
// pid. On error the cgroups made so far are removed.
func setupCgroups(id string, pid int, res providers.Resources) (map[string]string, []string, error) {
	own := ownCgroups()
	paths := make(map[string]string)
	var skipped []string
	limits := cgroupLimits(res)
	for _, ctrl := range cgroupControllers {
		base := cgroupRoot + "/" + ctrl
		if _, err := os.Stat(base + "/cgroup.procs"); err != nil {
			skipped = append(skipped, ctrl)
			continue
		}
		dir := base + strings.TrimSuffix(own[ctrl], "/") + "/" + cgroupPrefix + id
		if err := os.Mkdir(dir, 0o755); err != nil {
			skipped = append(skipped, ctrl)
			continue
		}
		paths[ctrl] = dir
		for _, kv := range limits[ctrl] {
			name, optional := strings.CutSuffix(kv[0], "?")
			if err := os.WriteFile(dir+"/"+name, []byte(kv[1]), 0); err != nil && !optional {
				removeCgroups(context.Background(), paths)
				return nil, nil, fmt.Errorf("set %s: %w", name, err)
			}
		}
		if err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(pid)), 0); err != nil {
			removeCgroups(context.Background(), paths)
			return nil, nil, fmt.Errorf("move init into %s cgroup: %w", ctrl, err)
		}
	}
	if _, ok := paths["memory"]; !ok && res.MemoryMiB != nil {
		lim := uint64(*res.MemoryMiB << 20)
		if err := unix.Prlimit(pid, unix.RLIMIT_AS, &unix.Rlimit{Cur: lim, Max: lim}, nil); err != nil {
			return nil, nil, fmt.Errorf("set RLIMIT_AS: %w", err)
		}
	}
	return paths, skipped, nil
}

// removeCgroups removes the cgroups in paths, SIGKILLing what is still in
// them and waiting (until ctx ends) for them to empty.
func removeCgroups(ctx context.Context, paths map[string]string) error {
	var errs []error
	for ctrl, dir := range paths {
		for {
			err := os.Remove(dir)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) {
				errs = append(errs, fmt.Errorf("remove %s cgroup: %w", ctrl, err))
				break
			}
			killCgroup(dir)
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("remove %s cgroup: still busy", ctrl))
				break
			}
			time.Sleep(5 * time.Millisecond) // polling a kernel state that has no notification
		}
	}
	return errors.Join(errs...)
}

func killCgroup(dir string) {
	b, _ := os.ReadFile(dir + "/cgroup.procs")
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// freezerState reads freezer.state: THAWED, FREEZING or FROZEN.
func freezerState(dir string) (string, error) {
	b, err := os.ReadFile(dir + "/freezer.state")
	return strings.TrimSpace(string(b)), err
}

// freeze writes state to the freezer and waits (until ctx ends) for the
// kernel to get there.
func freeze(ctx context.Context, dir, state string) error {
	if err := os.WriteFile(dir+"/freezer.state", []byte(state), 0); err != nil {
		return err
	}
	for {
		s, err := freezerState(dir)
		if err != nil {
			return err
		}
		if s == state {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("freezer stuck in %s", s)
		}
		time.Sleep(time.Millisecond) // FREEZING has no notification in v1
	}
}
