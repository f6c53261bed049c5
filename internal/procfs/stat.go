// Package procfs reads what sandgate needs of /proc and of a memory
// cgroup: one parser of /proc/<pid>/stat for the gateway (a local
// sandbox's init, seen from the host) and the agent (the processes of its
// sandbox), and one count of OOM kills for both.
package procfs

import (
	"bytes"
	"errors"
	"os"
	"strconv"
)

// Stat is the part of /proc/<pid>/stat sandgate uses.
type Stat struct {
	State           byte // R, S, D, Z (zombie), X (dead), ...
	PPid, PGid, Sid int
	TPGid           int // foreground process group of the controlling terminal, or -1
	StartTime       uint64
	// ExitCode is a zombie's wait status (field 52, Linux 3.5+; shown to
	// a reader allowed to ptrace the process), -1 if absent.
	ExitCode int
	// Execing reports a process inside an execve, between its new
	// address space and the layout of its stack: a user process, alive,
	// whose environment's end (field 51, shown as ExitCode is) is not set.
	// Its environ and cmdline read empty until the layout.
	Execing bool
	// EnvBytes is the size of the environment block (fields 50 and 51).
	EnvBytes uint64
}

// Dead reports a process that has exited (a zombie awaiting its reaping,
// or on its way out).
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' }

// ReadStat parses /proc/<pid>/stat under proc. The command name (field 2)
// may hold spaces and parentheses, so fields are counted from the last
// ')'.
func ReadStat(proc string, pid int) (Stat, error) {
	b, err := os.ReadFile(proc + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(b)
}

// pfKthread is the kernel's PF_KTHREAD task flag (field 9): a kernel
// thread has no address space of its own.
const pfKthread = 0x00200000

// ParseStat parses the contents of a /proc/<pid>/stat file.
func ParseStat(b []byte) (Stat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, errors.New("malformed stat")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); field N is f[N-3].
	if len(f) < 20 {
		return Stat{}, errors.New("malformed stat")
	}
	atoi := func(b []byte) int { n, _ := strconv.Atoi(string(b)); return n }
	start, _ := strconv.ParseUint(string(f[19]), 10, 64)
	st := Stat{State: f[0][0], PPid: atoi(f[1]), PGid: atoi(f[2]), Sid: atoi(f[3]), TPGid: atoi(f[5]), StartTime: start, ExitCode: -1}
	if len(f) > 49 {
		st.ExitCode = atoi(f[49])
		flags, _ := strconv.ParseUint(string(f[6]), 10, 64)
		envStart, _ := strconv.ParseUint(string(f[47]), 10, 64)
		envEnd, _ := strconv.ParseUint(string(f[48]), 10, 64)
		st.Execing = flags&pfKthread == 0 && envEnd == 0 && !st.Dead()
		if envEnd > envStart {
			st.EnvBytes = envEnd - envStart
		}
	}
	return st, nil
}

// OOMKills is the oom_kill count of a memory cgroup's flat keyed file
// (memory.events in cgroup v2, memory.oom_control in v1): how many of its
// processes the kernel killed for want of memory. 0 when the file cannot
// be read or has no count.
func OOMKills(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return ParseOOMKills(b)
}

// ParseOOMKills is the oom_kill count of the contents of such a file.
func ParseOOMKills(b []byte) int64 {
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}
