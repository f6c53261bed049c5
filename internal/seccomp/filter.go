package seccomp

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/elastic/go-seccomp-bpf/arch"
	moby "github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// dockerCaps is the capability set Docker gives a container by default
// (moby's oci/caps.DefaultCapabilities). The profile is resolved against
// it, so its capability-conditional rules come out as for a plain
// `docker run`: of the rules that name a capability, only chroot's
// (CAP_SYS_CHROOT) is in; those for CAP_SYS_ADMIN, CAP_SYS_PTRACE,
// CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_TIME, CAP_BPF, ... are out.
var dockerCaps = []string{
	"CAP_AUDIT_WRITE", "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_MKNOD", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SETFCAP",
	"CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_CHROOT",
}

// Offsets in struct seccomp_data. Arguments are 64 bits; the offsets of
// their halves are for a little-endian architecture, which all those with
// a syscall table in go-seccomp-bpf/arch are.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

func offLo(arg uint) uint32 { return offArgs + 8*uint32(arg) }
func offHi(arg uint) uint32 { return offLo(arg) + 4 }

const (
	// maxInstructions is the kernel's limit on a filter's length
	// (BPF_MAXINSNS).
	maxInstructions = 4096
	// leafSize is how many syscalls the search tree tests one after the
	// other rather than by bisection.
	leafSize = 4
)

// profile returns Docker's default profile resolved for this host (its
// kernel version and GOARCH) and a container with dockerCaps.
func profile() (*specs.LinuxSeccomp, error) {
	spec := &specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: dockerCaps},
	}}
	return moby.GetDefaultProfile(spec)
}

// rule is everything the filter decides about one syscall.
type rule struct {
	nr     uint32
	action uint32 // a SECCOMP_RET_* value, errno included
	// sets are OR'd and the comparisons in one set AND'd; no sets means
	// the action applies whatever the arguments. When no set matches, the
	// syscall gets the default action.
	sets [][]specs.LinuxSeccompArg
}

// rules returns a rule for each syscall that p names on info's
// architecture, in ascending number. Names the architecture lacks (the
// 32-bit ABI's chown32, socketcall, ...) are skipped, as runc skips them.
// Rules for one syscall merge when they share an action (an unconditional
// one wins); differing actions are an error: the default profile has none,
// and this compiler does not rank actions as libseccomp does.
func rules(p *specs.LinuxSeccomp, info *arch.Info) ([]*rule, error) {
	byNr := make(map[uint32]*rule)
	for _, s := range p.Syscalls {
		act, err := action(s.Action, s.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("%v: %w", s.Names, err)
		}
		if err := checkArgs(s.Args); err != nil {
			return nil, fmt.Errorf("%v: %w", s.Names, err)
		}
		for _, name := range s.Names {
			n, ok := info.SyscallNames[name]
			if !ok {
				continue
			}
			nr := uint32(n)
			r := byNr[nr]
			switch {
			case r == nil:
				r = &rule{nr: nr, action: act}
				byNr[nr] = r
			case r.action != act:
				return nil, fmt.Errorf("%s: conflicting actions %#x and %#x", name, r.action, act)
			case len(r.sets) == 0:
				continue // already unconditional
			}
			if len(s.Args) == 0 {
				r.sets = nil
				continue
			}
			r.sets = append(r.sets, s.Args)
		}
	}
	out := make([]*rule, 0, len(byNr))
	for _, nr := range slices.Sorted(maps.Keys(byNr)) {
		out = append(out, byNr[nr])
	}
	return out, nil
}

// action translates a profile action into a SECCOMP_RET_* value. Only the
// two the default profile uses are supported.
func action(a specs.LinuxSeccompAction, errno *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActErrno:
		e := uint(unix.EPERM) // runc's default when the profile names none
		if errno != nil {
			e = *errno
		}
		if e > unix.SECCOMP_RET_DATA {
			return 0, fmt.Errorf("errno %d out of range", e)
		}
		return unix.SECCOMP_RET_ERRNO | uint32(e), nil
	}
	return 0, fmt.Errorf("unsupported action %s", a)
}

// checkArgs rejects comparisons the compiler cannot express faithfully.
func checkArgs(args []specs.LinuxSeccompArg) error {
	var seen [6]bool
	for _, a := range args {
		if a.Index >= uint(len(seen)) {
			return fmt.Errorf("argument index %d", a.Index)
		}
		// libseccomp and runc disagree on what two comparisons of one
		// argument mean (opencontainers/runc#2735): refuse to guess.
		if seen[a.Index] {
			return fmt.Errorf("argument %d compared twice", a.Index)
		}
		seen[a.Index] = true
		switch a.Op {
		case specs.OpEqualTo, specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual,
			specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpMaskedEqual:
		default:
			return fmt.Errorf("argument %d: unsupported operator %s", a.Index, a.Op)
		}
	}
	return nil
}

// program compiles p into a seccomp BPF program for info's architecture.
// In order, the program:
//   - gives a syscall of any other ABI (i386 via int 0x80 on x86_64) the
//     default action, where Docker's profile would let i386 and x32 through;
//   - answers ENOSYS for a number above the highest the profile names
//     (x32's numbers, which have bit 30 set, among them), as runc does so
//     that a libc falls back from a syscall newer than the profile;
//   - finds the syscall's rule by bisection over the syscall numbers,
//     checks its arguments, and returns its action, or the default action
//     for a syscall without a rule or whose arguments match none.
func program(p *specs.LinuxSeccomp, info *arch.Info) ([]bpf.Instruction, error) {
	if len(info.SyscallNames) == 0 {
		return nil, fmt.Errorf("no syscall table for %s", info.Name)
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("default action: %w", err)
	}
	if len(p.Flags) > 0 || p.ListenerPath != "" {
		return nil, errors.New("profile flags and listeners are not supported")
	}
	rs, err := rules(p, info)
	if err != nil {
		return nil, err
	}
	if len(rs) == 0 {
		return nil, errors.New("profile names no syscall of this architecture")
	}
	c := compiler{def: def}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: def},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: rs[len(rs)-1].nr, SkipFalse: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
	}
	prog = append(prog, c.tree(rs)...)
	if c.err != nil {
		return nil, c.err
	}
	if len(prog) > maxInstructions {
		return nil, fmt.Errorf("program has %d instructions, the kernel takes at most %d", len(prog), maxInstructions)
	}
	return prog, nil
}

// compiler emits code that is only ever entered at its start and left by
// a return: every jump is forward and lands inside the same piece of code,
// so pieces concatenate without fixing up offsets. The first error sticks.
type compiler struct {
	def uint32 // the default action
	err error
}

// tree returns code that, with the syscall number in A, applies the rule
// for it among rs (sorted), or the default action.
func (c *compiler) tree(rs []*rule) []bpf.Instruction {
	if len(rs) <= leafSize {
		var out []bpf.Instruction
		for _, r := range rs {
			out = append(out, c.rule(r)...)
		}
		return append(out, bpf.RetConstant{Val: c.def})
	}
	mid := len(rs) / 2
	left, right := c.tree(rs[:mid]), c.tree(rs[mid:])
	out := c.skipIf(bpf.JumpGreaterThan, rs[mid-1].nr, len(left))
	out = append(out, left...)
	return append(out, right...)
}

// rule returns code that, with the syscall number in A, returns r's
// decision if the number is r's, and falls through otherwise.
func (c *compiler) rule(r *rule) []bpf.Instruction {
	if len(r.sets) == 0 {
		return []bpf.Instruction{
			bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: r.nr, SkipTrue: 1},
			bpf.RetConstant{Val: r.action},
		}
	}
	// Each set ends in the action; a comparison that fails jumps past it,
	// to the next set or to the default action after the last.
	body := []bpf.Instruction{bpf.RetConstant{Val: c.def}}
	for _, set := range slices.Backward(r.sets) {
		code := []bpf.Instruction{bpf.RetConstant{Val: r.action}}
		for _, a := range slices.Backward(set) {
			// code is the rest of the set: skipping it reaches body.
			code = append(c.compare(a, len(code)), code...)
		}
		body = append(code, body...)
	}
	return append(c.skipIf(bpf.JumpNotEqual, r.nr, len(body)), body...)
}

// compare returns code that falls through if argument a.Index compares to
// a.Value as a.Op says, and otherwise skips fail instructions past its
// end. It compares all 64 bits, as libseccomp does, one half at a time.
func (c *compiler) compare(a specs.LinuxSeccompArg, fail int) []bpf.Instruction {
	hi, lo := uint32(a.Value>>32), uint32(a.Value)
	ldHi := bpf.LoadAbsolute{Off: offHi(a.Index), Size: 4}
	ldLo := bpf.LoadAbsolute{Off: offLo(a.Index), Size: 4}
	// jump returns a conditional jump to the failure target from an
	// instruction followed by rest more in this comparison; pass, to the
	// end of the comparison.
	jump := func(cond bpf.JumpTest, val uint32, rest int) bpf.JumpIf {
		return bpf.JumpIf{Cond: cond, Val: val, SkipTrue: c.skip(rest + fail)}
	}
	pass := func(cond bpf.JumpTest, val uint32, rest int) bpf.JumpIf {
		return bpf.JumpIf{Cond: cond, Val: val, SkipTrue: c.skip(rest)}
	}
	// Ordered comparisons: the high halves decide unless they are equal.
	ordered := func(hiPass, loFail bpf.JumpTest) []bpf.Instruction {
		return []bpf.Instruction{ldHi, pass(hiPass, hi, 3), jump(bpf.JumpNotEqual, hi, 2), ldLo, jump(loFail, lo, 0)}
	}
	switch a.Op {
	case specs.OpEqualTo:
		return []bpf.Instruction{ldHi, jump(bpf.JumpNotEqual, hi, 2), ldLo, jump(bpf.JumpNotEqual, lo, 0)}
	case specs.OpNotEqual:
		return []bpf.Instruction{ldHi, pass(bpf.JumpNotEqual, hi, 2), ldLo, jump(bpf.JumpEqual, lo, 0)}
	case specs.OpGreaterThan:
		return ordered(bpf.JumpGreaterThan, bpf.JumpLessOrEqual)
	case specs.OpGreaterEqual:
		return ordered(bpf.JumpGreaterThan, bpf.JumpLessThan)
	case specs.OpLessThan:
		return ordered(bpf.JumpLessThan, bpf.JumpGreaterOrEqual)
	case specs.OpLessEqual:
		return ordered(bpf.JumpLessThan, bpf.JumpGreaterThan)
	case specs.OpMaskedEqual: // arg & Value == ValueTwo
		and := func(v uint32) bpf.ALUOpConstant { return bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: v} }
		return []bpf.Instruction{
			ldHi, and(hi), jump(bpf.JumpNotEqual, uint32(a.ValueTwo>>32), 3),
			ldLo, and(lo), jump(bpf.JumpNotEqual, uint32(a.ValueTwo), 0),
		}
	}
	c.fail(fmt.Errorf("argument %d: unsupported operator %s", a.Index, a.Op))
	return nil
}

// skipIf returns code that skips the n instructions after it if A
// compares to val as cond says: one conditional jump, or, for n past its
// 8-bit reach, one over an unconditional jump.
func (c *compiler) skipIf(cond bpf.JumpTest, val uint32, n int) []bpf.Instruction {
	if n <= math.MaxUint8 {
		return []bpf.Instruction{bpf.JumpIf{Cond: cond, Val: val, SkipTrue: uint8(n)}}
	}
	return []bpf.Instruction{
		bpf.JumpIf{Cond: cond, Val: val, SkipFalse: 1},
		bpf.Jump{Skip: uint32(n)},
	}
}

// skip converts a conditional jump's distance, which must fit in 8 bits.
// A comparison's jumps stay within its set of comparisons, which would
// have to hold some fifty of them to be out of reach.
func (c *compiler) skip(n int) uint8 {
	if n > math.MaxUint8 {
		c.fail(fmt.Errorf("conditional jump of %d instructions", n))
	}
	return uint8(n)
}

func (c *compiler) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// nativeArch returns the syscall table of the architecture this binary
// was built for.
func nativeArch() (*arch.Info, error) {
	return arch.GetInfo("")
}
