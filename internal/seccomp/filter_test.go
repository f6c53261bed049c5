package seccomp

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data, as the filter sees it.
type seccompData struct {
	nr, arch uint32
	args     [6]uint64
}

// run runs the program in x/net/bpf's VM. The VM loads 32-bit words
// big-endian, so each word goes in big-endian at the offset the kernel
// would give it.
func run(t *testing.T, vm *bpf.VM, d seccompData) uint32 {
	t.Helper()
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], d.nr)
	binary.BigEndian.PutUint32(b[offArch:], d.arch)
	for i, a := range d.args {
		binary.BigEndian.PutUint32(b[offLo(uint(i)):], uint32(a))
		binary.BigEndian.PutUint32(b[offHi(uint(i)):], uint32(a>>32))
	}
	ret, err := vm.Run(b)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

// nativeVM compiles the default profile for this host and loads it in a
// VM, which checks that every jump lands inside the program and that it
// ends in a return.
func nativeVM(t *testing.T) (*bpf.VM, *specs.LinuxSeccomp, *arch.Info) {
	t.Helper()
	p, err := profile()
	if err != nil {
		t.Fatal(err)
	}
	info, err := nativeArch()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := program(p, info)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	return vm, p, info
}

func retString(ret uint32) string {
	switch ret & unix.SECCOMP_RET_ACTION_FULL {
	case unix.SECCOMP_RET_ALLOW:
		return "allow"
	case unix.SECCOMP_RET_ERRNO:
		return "errno " + syscall.Errno(ret&unix.SECCOMP_RET_DATA).Error()
	}
	return fmt.Sprintf("%#x", ret)
}

func TestSyscallCases(t *testing.T) {
	vm, _, info := nativeVM(t)
	cases, err := syscallCases()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		d := seccompData{nr: c.nr, arch: c.arch, args: c.args}
		if d.arch == 0 {
			d.arch = uint32(info.ID)
		}
		want := uint32(unix.SECCOMP_RET_ALLOW)
		if c.want != 0 {
			want = unix.SECCOMP_RET_ERRNO | uint32(c.want)
		}
		if got := run(t, vm, d); got != want {
			t.Errorf("%s: %s, want %s", c.desc, retString(got), retString(want))
		}
	}
}

// TestProgramMatchesProfile checks the program against the profile's rules
// read directly, for every syscall number and for the values around each
// comparison the profile makes.
func TestProgramMatchesProfile(t *testing.T) {
	vm, p, info := nativeVM(t)
	sweep(t, vm, p, info)
}

// TestComparisons does the same for a made-up profile with every
// operator the compiler accepts, on low and high halves, several
// arguments, OR'd rules and errno actions.
func TestComparisons(t *testing.T) {
	info, err := nativeArch()
	if err != nil {
		t.Fatal(err)
	}
	eperm, eacces, enoent := uint(unix.EPERM), uint(unix.EACCES), uint(unix.ENOENT)
	arg := func(i uint, op specs.LinuxSeccompOperator, v, v2 uint64) specs.LinuxSeccompArg {
		return specs.LinuxSeccompArg{Index: i, Op: op, Value: v, ValueTwo: v2}
	}
	sc := func(name string, act specs.LinuxSeccompAction, errno *uint, args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{name}, Action: act, ErrnoRet: errno, Args: args}
	}
	const big = 5<<32 | 7
	p := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eacces,
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "write"}, Action: specs.ActAllow},
			sc("openat", specs.ActAllow, nil, arg(0, specs.OpEqualTo, big, 0)),
			sc("close", specs.ActAllow, nil, arg(1, specs.OpNotEqual, big, 0)),
			sc("dup", specs.ActAllow, nil, arg(0, specs.OpLessThan, big, 0)),
			sc("dup3", specs.ActAllow, nil, arg(2, specs.OpLessEqual, big, 0)),
			sc("fcntl", specs.ActAllow, nil, arg(0, specs.OpGreaterThan, big, 0)),
			sc("ioctl", specs.ActAllow, nil, arg(5, specs.OpGreaterEqual, big, 0)),
			sc("mmap", specs.ActAllow, nil, arg(3, specs.OpMaskedEqual, 0xf0000000f0, 0x1000000010)),
			// OR'd rules with two arguments each.
			sc("kill", specs.ActAllow, nil, arg(0, specs.OpEqualTo, 1, 0), arg(1, specs.OpLessThan, 9, 0)),
			sc("kill", specs.ActAllow, nil, arg(0, specs.OpGreaterThan, 1<<40, 0), arg(1, specs.OpNotEqual, 0, 0)),
			sc("tkill", specs.ActErrno, &enoent, arg(1, specs.OpEqualTo, 0, 0)),
			sc("getpid", specs.ActErrno, &eperm),
			// Conditional, then unconditional with the same action: the
			// unconditional one wins.
			sc("getppid", specs.ActAllow, nil, arg(0, specs.OpEqualTo, 1, 0)),
			sc("getppid", specs.ActAllow, nil),
			{Names: []string{"no_such_syscall"}, Action: specs.ActAllow},
		},
	}
	prog, err := program(p, info)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	sweep(t, vm, p, info)
}

// TestConflictingActions: a syscall the profile gives two actions is an
// error, not a filter that silently picks one.
func TestConflictingActions(t *testing.T) {
	info, err := nativeArch()
	if err != nil {
		t.Fatal(err)
	}
	p := &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno,
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read"}, Action: specs.ActAllow},
			{Names: []string{"read"}, Action: specs.ActErrno},
		},
	}
	if _, err := program(p, info); err == nil || !strings.Contains(err.Error(), "conflicting actions") {
		t.Fatalf("got %v, want conflicting actions", err)
	}
}

// sweep compares the program in vm with decide for every syscall number
// up to a few past the profile's highest, with each argument the profile
// compares taken through values around the comparison (the other
// arguments zero), and a few random values.
func sweep(t *testing.T, vm *bpf.VM, p *specs.LinuxSeccomp, info *arch.Info) {
	t.Helper()
	maxNr := highestNr(p, info)
	rng := rand.New(rand.NewPCG(1, 2))
	runs := 0
	for nr := uint32(0); nr <= maxNr+3; nr++ {
		name := info.SyscallNumbers[int(nr)]
		candidates := map[uint][]uint64{0: {0, minus1}}
		for _, s := range p.Syscalls {
			if !slices.Contains(s.Names, name) {
				continue
			}
			for _, a := range s.Args {
				v, v2 := a.Value, a.ValueTwo
				candidates[a.Index] = append(candidates[a.Index],
					0, 1, minus1, 0xffffffff, 1<<32, rng.Uint64(), uint64(rng.Uint32()),
					v-1, v, v+1, v^1<<32, v+1<<32, v-1<<32, v2, v2|^v, v2^1, v2^1<<32)
			}
		}
		// Every combination of the candidates of each compared argument.
		combos := []seccompData{{nr: nr, arch: uint32(info.ID)}}
		for _, i := range slices.Sorted(maps.Keys(candidates)) {
			var next []seccompData
			for _, d := range combos {
				for _, v := range candidates[i] {
					d.args[i] = v
					next = append(next, d)
				}
			}
			combos = next
		}
		for _, d := range combos {
			runs++
			if got, want := run(t, vm, d), decide(p, info, maxNr, d); got != want {
				t.Fatalf("%s(%d) args %#x: %s, want %s", name, nr, d.args, retString(got), retString(want))
			}
		}
	}
	t.Logf("%d syscalls compared with the profile", runs)
}

// highestNr is the highest syscall number p names on info's architecture.
func highestNr(p *specs.LinuxSeccomp, info *arch.Info) uint32 {
	var n int
	for _, s := range p.Syscalls {
		for _, name := range s.Names {
			if nr, ok := info.SyscallNames[name]; ok {
				n = max(n, nr)
			}
		}
	}
	return uint32(n)
}

// decide reads the profile's verdict on d from its rules as written: the
// first rule that names the syscall and whose comparisons all hold, on
// the native architecture; ENOSYS past the highest syscall it names.
func decide(p *specs.LinuxSeccomp, info *arch.Info, maxNr uint32, d seccompData) uint32 {
	errno := func(e *uint, or uint) uint32 {
		if e != nil {
			or = *e
		}
		return unix.SECCOMP_RET_ERRNO | uint32(or)
	}
	if d.arch != uint32(info.ID) {
		return errno(p.DefaultErrnoRet, uint(unix.EPERM))
	}
	if d.nr > maxNr {
		return unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	}
	name := info.SyscallNumbers[int(d.nr)]
	for _, s := range p.Syscalls {
		if !slices.Contains(s.Names, name) {
			continue
		}
		holds := true
		for _, a := range s.Args {
			v := d.args[a.Index]
			switch a.Op {
			case specs.OpEqualTo:
				holds = holds && v == a.Value
			case specs.OpNotEqual:
				holds = holds && v != a.Value
			case specs.OpLessThan:
				holds = holds && v < a.Value
			case specs.OpLessEqual:
				holds = holds && v <= a.Value
			case specs.OpGreaterThan:
				holds = holds && v > a.Value
			case specs.OpGreaterEqual:
				holds = holds && v >= a.Value
			case specs.OpMaskedEqual:
				holds = holds && v&a.Value == a.ValueTwo
			}
		}
		if !holds {
			continue
		}
		if s.Action == specs.ActAllow {
			return unix.SECCOMP_RET_ALLOW
		}
		return errno(s.ErrnoRet, uint(unix.EPERM))
	}
	return errno(p.DefaultErrnoRet, uint(unix.EPERM))
}

// TestProgramSize: the kernel refuses a program longer than BPF_MAXINSNS.
func TestProgramSize(t *testing.T) {
	p, err := profile()
	if err != nil {
		t.Fatal(err)
	}
	info, err := nativeArch()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := program(p, info)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules(p, info)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > maxInstructions {
		t.Fatalf("%d instructions, the kernel takes at most %d", len(raw), maxInstructions)
	}
	t.Logf("%d instructions for %d syscalls on %s", len(raw), len(rs), info.Name)
}

// TestProfileRules checks the resolved profile for rules that overlap: on
// this architecture no syscall may get two actions, be both allowed
// outright and under conditions (the conditions would be dead), or be
// named twice with the same conditions.
func TestProfileRules(t *testing.T) {
	p, err := profile()
	if err != nil {
		t.Fatal(err)
	}
	info, err := nativeArch()
	if err != nil {
		t.Fatal(err)
	}
	byName := make(map[string][]specs.LinuxSyscall)
	for _, s := range p.Syscalls {
		for _, name := range s.Names {
			if _, ok := info.SyscallNames[name]; ok {
				byName[name] = append(byName[name], s)
			}
		}
	}
	for name, ss := range byName {
		for i, s := range ss {
			if s.Action != ss[0].Action || !equalPtr(s.ErrnoRet, ss[0].ErrnoRet) {
				t.Errorf("%s: actions %s and %s", name, ss[0].Action, s.Action)
			}
			if len(ss) > 1 && len(s.Args) == 0 {
				t.Errorf("%s: allowed outright and in %d other rules", name, len(ss)-1)
			}
			for _, o := range ss[:i] {
				if slices.Equal(o.Args, s.Args) {
					t.Errorf("%s: two rules with arguments %v", name, s.Args)
				}
			}
		}
	}
}

func equalPtr(a, b *uint) bool { return a == b || a != nil && b != nil && *a == *b }

// TestProfileNamesKnown: a name the profile gives that the native syscall
// table lacks is skipped. That is right for another ABI's syscalls
// (chown32, socketcall), but a syscall too new for go-seccomp-bpf/arch
// would be refused without notice: it must be a syscall of another
// architecture the tables know, or one of the few they do not cover.
func TestProfileNamesKnown(t *testing.T) {
	p, err := profile()
	if err != nil {
		t.Fatal(err)
	}
	info, err := nativeArch()
	if err != nil {
		t.Fatal(err)
	}
	otherArch := map[string]bool{
		"riscv_hwprobe": true, // riscv64 only; go-seccomp-bpf has no riscv table
	}
	others := []*arch.Info{arch.I386, arch.X32, arch.ARM, arch.AARCH64, arch.X86_64}
	for _, s := range p.Syscalls {
		for _, name := range s.Names {
			if _, ok := info.SyscallNames[name]; ok || otherArch[name] {
				continue
			}
			if !slices.ContainsFunc(others, func(a *arch.Info) bool { _, ok := a.SyscallNames[name]; return ok }) {
				t.Errorf("%s: in the profile but in no syscall table (go-seccomp-bpf/arch too old?)", name)
			}
		}
	}
}
