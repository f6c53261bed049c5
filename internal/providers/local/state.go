package local

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/sandgate/sandgate/internal/procfs"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
)

// persisted is what a sandbox's directory records in state.json, so that a
// later gateway process can find and use the sandbox (adoption).
type persisted struct {
	ID        string            `json:"id"`
	Isolation string            `json:"isolation"`
	Workdir   string            `json:"workdir"`
	Env       map[string]string `json:"env,omitempty"`
	Pid       int               `json:"pid"`        // init, in the host's pid namespace
	StartTime uint64            `json:"start_time"` // of init, field 22 of /proc/<pid>/stat
	Cgroups   map[string]string `json:"cgroups,omitempty"`
	Created   time.Time         `json:"created"`
	// IDBase is the host uid and gid of the sandbox's root: the sandbox
	// owns host ids IDBase..IDBase+65535. 0 for sandboxes made before
	// ranges (identity mapping) and for isolation "none".
	IDBase uint32 `json:"id_base,omitempty"`
	// DiskBytes is the size of the sandbox's own filesystem (0: none; its
	// writes land on the state directory's filesystem).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// DiskFS is its kind (jail.FSBtrfs, jail.FSExt4; "" for ext4 before btrfs).
	DiskFS string `json:"disk_fs,omitempty"`
	// Snapshot is the snapshot the sandbox was made from, and Layers its
	// layers (the newest first), stacked above the root image.
	Snapshot string       `json:"snapshot,omitempty"`
	Layers   []jail.Layer `json:"layers,omitempty"`
	// View is the host-view directory the sandbox's root is built from
	// (under <state>/views), or "" for an image root.
	View string `json:"view,omitempty"`
	// Image is the root filesystem directory of an image, if one was asked for.
	Image string `json:"image,omitempty"`
}

const (
	stateFile  = "state.json"
	pausedFile = "paused" // exists while paused by signals (no freezer)
	socketName = "agent.sock"
	logName    = "init.log"
)

// writeJSON writes v to path atomically (aside, then renamed), for root
// only.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func writeState(dir string, st persisted) error {
	return writeJSON(dir+"/"+stateFile, st)
}

func readState(dir string) (persisted, error) {
	var st persisted
	b, err := os.ReadFile(dir + "/" + stateFile)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", stateFile, err)
	}
	return st, nil
}

// alive reports whether pid is still the process that started at
// startTime and has not exited. A dead init stays a zombie with the same
// start time until host PID 1 gets round to reaping it.
func alive(pid int, startTime uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := procfs.ReadStat("/proc", pid)
	return err == nil && st.StartTime == startTime && !st.Dead()
}
