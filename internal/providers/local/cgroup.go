package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
)

// Cgroup v1 handling. Each sandbox gets one cgroup per controller, named
// sandgate-<id>, created under the gateway's own cgroup of that hierarchy
// (for memory that nests the sandbox's limit inside the gateway's); in the
// pids hierarchy under a common parent, pidsParent, whose limit bounds all
// sandboxes together so that they can never take every pid of the host.
// Setup joins the cgroups before it starts init, so init and every command
// are inside from the start, and the sandbox's cgroup namespace is rooted
// there: the hierarchy above is not even visible.
//
// The cgroup files belong to host root. Sandbox root is an unprivileged
// host uid without a way to a user namespace of its own, so it can neither
// write its limits nor mount a hierarchy to get at them.

const (
	cgroupRoot   = "/sys/fs/cgroup"
	cgroupPrefix = "sandgate-"
	pidsParent   = "sandgate"
	cfsPeriod    = 100000 // µs
)

// cpuacct: a sandbox's CPU time, for its metrics (where cpu and cpuacct
// are one hierarchy, the same directory twice).
var cgroupControllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

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

// ensurePidsParent creates the pids cgroup all sandboxes share and caps it
// at max. Without a writable pids hierarchy it does nothing.
func ensurePidsParent(max int64) error {
	base := cgroupRoot + "/pids"
	if _, err := os.Stat(base + "/cgroup.procs"); err != nil {
		return nil
	}
	dir := base + strings.TrimSuffix(ownCgroups()["pids"], "/") + "/" + pidsParent
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create pids cgroup %s: %w", dir, err)
	}
	if err := os.WriteFile(dir+"/pids.max", []byte(strconv.FormatInt(max, 10)), 0); err != nil {
		return fmt.Errorf("limit pids of all sandboxes: %w", err)
	}
	return nil
}

// cgroupLimits are the files to write in each controller's cgroup.
func cgroupLimits(res providers.Resources, pidsMax int64) map[string][][2]string {
	lim := map[string][][2]string{
		"pids": {{"pids.max", strconv.FormatInt(pidsMax, 10)}},
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

// createCgroups creates the sandbox's cgroups and writes res into them;
// setup moves itself in before starting init. A hierarchy the gateway
// cannot write to is skipped (the returned map lacks it; see
// limitWithoutCgroup). On error the cgroups made so far are removed.
func createCgroups(id string, res providers.Resources, pidsMax int64) (map[string]string, []string, error) {
	own := ownCgroups()
	paths := make(map[string]string)
	var skipped []string
	limits := cgroupLimits(res, pidsMax)
	for _, ctrl := range cgroupControllers {
		base := cgroupRoot + "/" + ctrl
		if _, err := os.Stat(base + "/cgroup.procs"); err != nil {
			skipped = append(skipped, ctrl)
			continue
		}
		if ctrl == "cpuacct" && sameFile(base, cgroupRoot+"/cpu") {
			continue // one hierarchy with cpu: its directory has cpuacct's files
		}
		parent := base + strings.TrimSuffix(own[ctrl], "/")
		if ctrl == "pids" {
			if _, err := os.Stat(parent + "/" + pidsParent); err == nil {
				parent += "/" + pidsParent
			}
		}
		dir := parent + "/" + cgroupPrefix + id
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
	}
	return paths, skipped, nil
}

// sameFile says a and b are one file (one hierarchy mounted as two
// controllers' directories).
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// limitWithoutCgroup applies a memory limit as RLIMIT_AS on init (which
// commands inherit) when there is no memory cgroup to hold it.
func limitWithoutCgroup(pid int, paths map[string]string, res providers.Resources) error {
	if _, ok := paths["memory"]; !ok && res.MemoryMiB != nil {
		lim := uint64(*res.MemoryMiB << 20)
		if err := unix.Prlimit(pid, unix.RLIMIT_AS, &unix.Rlimit{Cur: lim, Max: lim}, nil); err != nil {
			return fmt.Errorf("set RLIMIT_AS: %w", err)
		}
	}
	return nil
}

// setupCgroups are the cgroups setup's forking thread joins, so that init
// starts in them: the sandbox's own, except for pids, where init's
// threads stay in the parent (see joinPids).
func setupCgroups(paths map[string]string) map[string]string {
	out := make(map[string]string, len(paths))
	for ctrl, dir := range paths {
		if ctrl == "pids" {
			dir = filepath.Dir(dir)
		}
		out[ctrl] = dir
	}
	return out
}

// joinPids moves init's forker thread (tid in the sandbox's pid
// namespace), and so every command it forks from then on, into the
// sandbox's pids cgroup dir. Init's other threads stay in the parent: a
// fork bomb that fills the sandbox's limit cannot stop the Go runtime of
// init from starting a thread (which would end init, and the sandbox).
// Moving one thread takes no whole-process migration lock.
func joinPids(dir string, initPid, tid int) error {
	if dir == "" {
		return nil
	}
	host, err := hostTid(initPid, tid)
	if err != nil {
		return err
	}
	return os.WriteFile(dir+"/tasks", []byte(strconv.Itoa(host)), 0)
}

// hostTid finds, among pid's threads, the one whose id in its own pid
// namespace is tid, and returns its id on the host.
func hostTid(pid, tid int) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "NSpid:" && f[len(f)-1] == strconv.Itoa(tid) {
				return strconv.Atoi(f[1])
			}
		}
	}
	return 0, fmt.Errorf("no thread %d in process %d", tid, pid)
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
