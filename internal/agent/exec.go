package agent

import (
	"sync/atomic"
	"time"

	"github.com/sandgate/sandgate/internal/procfs"
)

// execSeq numbers the commands of this agent: with the pid it makes each
// command's marker unique.
var execSeq atomic.Int64

// drainGrace bounds how long a command's output is awaited after its tree
// is gone (or, with background processes preserved, after it returned).
const drainGrace = 250 * time.Millisecond

// oomKills is how many processes the kernel has killed for want of memory
// in the sandbox's cgroup (0 when the agent cannot tell).
func oomKills() int64 { return procfs.OOMKills("/sys/fs/cgroup/memory.events") }
