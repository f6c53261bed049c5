package agent

import (
	"fmt"
	"sync/atomic"
	"time"
)

// execSeq numbers the commands of this agent: with the pid it makes each
// command's marker unique.
var execSeq atomic.Int64

// drainGrace bounds how long a command's output is awaited after its tree
// is gone (or, with background processes preserved, after it returned).
const drainGrace = 250 * time.Millisecond

// oomNote is what a command killed for want of memory gets at the end of
// its stderr.
func (s *Server) oomNote() string {
	if s.opts.MemoryLimit > 0 {
		return fmt.Sprintf("\nsandgate: killed: out of memory (the sandbox's memory limit is %d MiB)\n", s.opts.MemoryLimit>>20)
	}
	return "\nsandgate: killed: out of memory (the sandbox's memory limit)\n"
}
