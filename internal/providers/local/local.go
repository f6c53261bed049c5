// Package local is the embedded sandbox provider: each sandbox is a
// directory under the state directory plus one set of Linux namespaces
// (user, pid, mount, uts, ipc, and a network namespace with only lo),
// with no daemon.
//
// A sandbox's init is the gateway binary re-executed with a hidden argument
// (see reexec.go). Init builds the root filesystem, an overlay whose lower
// layer is a read-only clone of the host's / and whose upper layer is the
// sandbox's directory, so the whole tree is writable copy-on-write and the
// host never changes. Init then serves the agent protocol (proto.go) on a
// unix socket in the sandbox's directory: every command is a fork of init,
// so every process of a sandbox shares its namespaces and cgroups.
//
// Users: the gateway runs as root and gives each sandbox its own range of
// 65,536 host ids (idmap.go): sandbox root is an unprivileged host uid,
// never host root. The root filesystem (hostview.go, rootfs.go) is not the
// host's: a curated, read-only, id-mapped view of the host's system
// directories or an image, with the sandbox's writes on a filesystem of
// its own sized by its disk limit (disk.go). Commands run without
// CAP_SYS_ADMIN and CAP_SYS_PTRACE, under a seccomp filter, unable to make
// user namespaces, in cgroups they cannot write (cgroup.go). Files the
// gateway reads and writes are opened by the agent inside the sandbox, as
// sandbox root (files.go).
//
// Everything the provider needs is in the sandbox's directory (state.json),
// so a new gateway process on the same state directory adopts the
// sandboxes of the previous one: they keep running across restarts.
//
// Isolation "none" runs commands as plain host processes (still children
// of a per-sandbox init, for cleanup), with the sandbox's paths mapped into
// <dir>/fs: a file written to /workspace/a lands in <dir>/fs/workspace/a and
// a command with cwd /workspace runs there, but commands see the host's
// filesystem otherwise.
package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"github.com/sandgate/sandgate/internal/egress/point"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/dockerimages"
	"github.com/sandgate/sandgate/internal/host"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/local/jail"
	"github.com/sandgate/sandgate/internal/rootfs"
	"github.com/sandgate/sandgate/internal/seccomp"
)

// ErrNoNamespaces is why a start with IsolationNamespaces fails where the
// gateway cannot make a sandbox's namespaces (not root, user namespaces
// off).
var ErrNoNamespaces = errors.New("the sandbox namespaces cannot be made here")

// Isolation modes.
const (
	IsolationNamespaces = jail.IsolationNamespaces // namespaces, cgroups, seccomp: a sandbox of its own
	IsolationNone       = jail.IsolationNone       // commands run on the host, in the sandbox's directory
)

const (
	defaultReadyTimeout = 30 * time.Second
	defaultWorkdir      = "/workspace"
	deleteTimeout       = 20 * time.Second

	// DefaultIDBase is the first host id given to sandboxes, as in
	// /etc/subuid conventions.
	DefaultIDBase = 100000
	// DefaultMemoryMiB, DefaultDiskGiB and DefaultShmMiB apply when a
	// create asks for no limit of its own.
	DefaultMemoryMiB = 2048
	DefaultDiskGiB   = 10
	DefaultShmMiB    = 64
)

// Options configure New.
type Options struct {
	// StateDir holds one directory per sandbox under sandboxes/. It must
	// be on a local filesystem that supports overlay upper layers (ext4,
	// xfs, tmpfs). Required.
	StateDir string
	// Isolation is IsolationNamespaces (the default) or IsolationNone.
	Isolation string
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// IDBase is the first host uid/gid of the sandboxes' id ranges;
	// default DefaultIDBase. Sandbox n owns IDBase+n*65536 … +65535.
	IDBase uint32
	// DefaultMemoryMiB, DefaultCPU and DefaultDiskGiB are the limits of a
	// sandbox whose create does not set them (0: DefaultMemoryMiB,
	// no CPU limit, DefaultDiskGiB; negative: none).
	DefaultMemoryMiB int64
	DefaultCPU       float64
	DefaultDiskGiB   float64
	// PidsMax is each sandbox's process limit (0: a sixteenth of the
	// host's pid_max or threads-max, whichever is smaller, within 64..4096);
	// all sandboxes together get at most half of that host figure.
	PidsMax int64
	// ShmMiB sizes /dev/shm (0: DefaultShmMiB).
	ShmMiB int64
	// InitBinary runs each sandbox's setup and init: a build of
	// cmd/sandgate-agent (which holds this package's entry points) from
	// the same source as the gateway. "" re-executes the running binary,
	// which works as well but starts slower: a process of the gateway's
	// binary initialises every package it links (~50 ms on a 2-core VM,
	// against ~14 ms for the agent's), twice per create.
	InitBinary string
	// DiskPool is how many disks of the default size are kept made ahead
	// of creates (diskpool.go; 0: DefaultDiskPool, negative: none).
	DiskPool int
	// DiskFS is the filesystem of a sandbox's disk: "btrfs" (snapshots
	// possible), "ext4", or "" for btrfs where mkfs.btrfs is installed and
	// ext4 otherwise.
	DiskFS string
	// Images is the directory of images a create may name (absolute, or
	// relative to it): root filesystem directories, `docker save` or OCI
	// layout tarballs (unpacked once into <StateDir>/image-cache). Only
	// what is under it can be an image: the administrator's choice, never
	// an arbitrary host path. "" refuses every image.
	Images string
	// DockerImages, when set, is the local Docker daemon's image store: an
	// image the image directory lacks is taken from it (dockerimages.go).
	DockerImages *dockerimages.Daemon
	// Private lists more host directories no sandbox may see (the
	// gateway's state directory with its lease key and store), besides
	// StateDir. A sandbox's view of the host does not hold them unless they
	// are under a directory it gets (/usr, /opt, /etc); there they are
	// covered by an empty read-only directory.
	Private []string
	// Egress configures the egress point sandboxes with a policy other
	// than none go out through (package egress); made on first use.
	Egress point.Options
}

// Local is the local provider. It is safe for concurrent use. It holds no
// processes of its own (sandboxes outlive it) and no goroutines but its
// egress point's, which Close ends.
type Local struct {
	stateDir  string // absolute, symlinks resolved
	boxesDir  string // <stateDir>/sandboxes
	isolation string
	log       *slog.Logger
	seccomp   []byte // the filter of every command with namespaces, compiled once

	idBase       uint32
	private      []string      // host directories covered in every sandbox: StateDir and Options.Private
	images       string        // Options.Images, absolute; "" without
	dockerImages *dockerImages // nil without Options.DockerImages
	store        *rootfs.Store
	view         hostView   // the root image of sandboxes without one (namespaces only)
	initBin      string     // Options.InitBinary, or /proc/self/exe
	diskFS       string     // jail.FSBtrfs or jail.FSExt4
	snapMu       sync.Mutex // snapshot records and layers (snapshot.go)
	mkfs         string     // its mkfs, "" if disk limits cannot be made
	limits       providers.Resources
	pidsMax      int64
	shm          int64 // bytes

	mu       sync.Mutex
	boxes    map[string]*sandbox // known sandboxes: created here or adopted from disk
	creating map[string]bool     // ids whose Create is in progress
	ranges   map[int]string      // id ranges in use (index -> sandbox id), see idmap.go
	closed   bool

	egress *point.Lazy // egress.go
	disks  *diskPool   // nil without one (diskpool.go)
}

var (
	_ providers.Provider = (*Local)(nil)
	_ providers.Pauser   = (*Local)(nil)
)

// sandbox is one sandbox as the gateway knows it.
type sandbox struct {
	id  string
	dir string

	hostMu sync.Mutex          // guards host
	host   *agentclient.Client // the connection to init's agent, once made
	st     persisted

	// mu serialises the state changes: Pause, Resume, Delete.
	mu      sync.Mutex
	deleted bool // guarded by mu; a deleted sandbox is also gone from Local.boxes

	exitMu  sync.Mutex // guards pidfd and exitWhy (see exit.go)
	pidfd   *os.File   // on init, held from create or adoption until forgotten; nil without
	exitWhy string     // how init ended, once known
}

// New returns a provider keeping its sandboxes under opts.StateDir. With
// isolation "namespaces" it first checks that this process can make
// sandboxes and, if not, returns an error that says why.
func New(opts Options) (*Local, error) {
	if opts.Isolation == "" {
		opts.Isolation = IsolationNamespaces
	}
	if opts.Isolation != IsolationNamespaces && opts.Isolation != IsolationNone {
		return nil, fmt.Errorf("local: unknown isolation %q (want %q or %q)", opts.Isolation, IsolationNamespaces, IsolationNone)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.StateDir == "" {
		return nil, errors.New("local: no state directory")
	}
	if err := os.MkdirAll(opts.StateDir+"/sandboxes", 0o700); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	dir, err := filepath.EvalSymlinks(opts.StateDir)
	if err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	// The overlay's mount options are a comma-separated list.
	if strings.ContainsAny(dir, ",:\\\n") {
		return nil, fmt.Errorf("local: state directory %q contains one of , : \\ or a newline", dir)
	}
	if opts.IDBase == 0 {
		opts.IDBase = DefaultIDBase
	}
	if uint64(opts.IDBase)+maxRanges*jail.IDMapSize > 1<<32-2 {
		return nil, fmt.Errorf("local: id base %d leaves no room for %d ranges of %d ids", opts.IDBase, maxRanges, jail.IDMapSize)
	}
	bin := "/proc/self/exe"
	if opts.InitBinary != "" {
		if bin, err = filepath.Abs(opts.InitBinary); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		if fi, err := os.Stat(bin); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("local: init binary %s: not an executable file (build cmd/sandgate-agent beside the gateway: make build)", bin)
		}
	}
	if opts.Isolation == IsolationNamespaces {
		if err := probeNamespaces(bin, opts.IDBase); err != nil {
			return nil, fmt.Errorf("local: %w (isolation %q runs without them): %w", ErrNoNamespaces, IsolationNone, err)
		}
	}
	l := &Local{
		stateDir:  dir,
		boxesDir:  dir + "/sandboxes",
		isolation: opts.Isolation,
		egress:    point.NewLazy(opts.Egress),
		log:       opts.Logger,
		idBase:    opts.IDBase,
		initBin:   bin,
		boxes:     make(map[string]*sandbox),
		creating:  make(map[string]bool),
		ranges:    make(map[int]string),
	}
	if err := l.setLimits(opts); err != nil {
		return nil, err
	}
	l.private = []string{dir}
	for _, p := range opts.Private {
		if p, err := filepath.Abs(p); err == nil {
			if r, err := filepath.EvalSymlinks(p); err == nil {
				p = r
			}
			l.private = append(l.private, p)
		}
	}
	// The state directory holds the lease key and the store: only root
	// may enter it, whatever its parent allows.
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	views := l.loadRanges()
	if l.isolation == IsolationNamespaces && opts.Images != "" {
		if l.images, err = filepath.Abs(opts.Images); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		if err := os.MkdirAll(l.images, 0o700); err != nil {
			return nil, fmt.Errorf("local: image directory: %w", err)
		}
	}
	if l.isolation == IsolationNamespaces && opts.DockerImages != nil {
		l.dockerImages = &dockerImages{d: opts.DockerImages, dir: dir + "/docker-images"}
	}
	if l.images != "" || l.dockerImages != nil {
		if l.store, err = rootfs.Open(dir + "/image-cache"); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		l.store.Log = l.log
	}
	if l.isolation == IsolationNamespaces {
		if l.seccomp, err = seccomp.Compile(); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		viewsDir := dir + "/views"
		if err := os.MkdirAll(viewsDir, 0o700); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		if l.view, err = buildView(viewsDir); err != nil {
			return nil, fmt.Errorf("local: build the host view: %w", err)
		}
		views[l.view.dir] = true
		pruneViews(viewsDir, views)
		if err := ensurePidsParent(host.Procs() / 2); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
	}
	l.removeTrash()
	l.mountVolumes()
	if want := cmp.Or(opts.DiskPool, DefaultDiskPool); want > 0 && l.isolation == IsolationNamespaces && l.mkfs != "" && l.limits.DiskGiB != nil {
		size := int64(*l.limits.DiskGiB*(1<<10)) << 20 // as Create sizes it
		if l.disks, err = newDiskPool(dir+"/disk-pool", l.diskFS, l.mkfs, dir+"/disk-templates", size, want, l.log); err != nil {
			return nil, fmt.Errorf("local: disk pool: %w", err)
		}
	}
	return l, nil
}

// setLimits fills in the default limits from opts.
func (l *Local) setLimits(opts Options) error {
	mem, disk := opts.DefaultMemoryMiB, opts.DefaultDiskGiB
	if disk > 0 && disk*(1<<30) < jail.MinDiskBytes {
		return fmt.Errorf("local: a default disk limit of %g GiB is below the least, %d MiB", disk, jail.MinDiskBytes>>20)
	}
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	if disk == 0 {
		disk = DefaultDiskGiB
	}
	if mem > 0 {
		l.limits.MemoryMiB = &mem
	}
	if opts.DefaultCPU > 0 {
		cpu := opts.DefaultCPU
		l.limits.CPU = &cpu
	}
	if disk > 0 {
		l.limits.DiskGiB = &disk
	}
	l.pidsMax = opts.PidsMax
	if l.pidsMax <= 0 {
		l.pidsMax = host.DefaultPidsMax(host.Procs())
	}
	l.shm = opts.ShmMiB << 20
	if l.shm <= 0 {
		l.shm = DefaultShmMiB << 20
	}
	if l.isolation == IsolationNamespaces {
		if opts.DiskFS != "" && opts.DiskFS != jail.FSBtrfs && opts.DiskFS != jail.FSExt4 {
			return fmt.Errorf("local: disk filesystem %q: want %s or %s", opts.DiskFS, jail.FSBtrfs, jail.FSExt4)
		}
		fs, mkfs, err := jail.FindMkfs(opts.DiskFS)
		if err != nil && (disk > 0 || opts.DiskFS != "") {
			return fmt.Errorf("local: disk limits cannot be enforced (%v); set the default disk limit to none to run without", err)
		}
		l.diskFS, l.mkfs = fs, mkfs
	}
	return nil
}

// loadRanges marks the id ranges of the sandboxes on disk (also those
// half deleted) as used, and returns the host views they are built on.
func (l *Local) loadRanges() map[string]bool {
	views := make(map[string]bool)
	entries, _ := os.ReadDir(l.boxesDir)
	for _, e := range entries {
		st, err := readState(filepath.Join(l.boxesDir, e.Name()))
		if err != nil {
			continue
		}
		if i := rangeIndex(l.idBase, st.IDBase); st.IDBase != 0 && i >= 0 {
			l.ranges[i] = st.ID
		}
		if st.View != "" {
			views[st.View] = true
		}
	}
	return views
}

// probeNamespaces starts bin (the init binary) in a fresh set of sandbox
// namespaces and reports why that failed, if it did.
func probeNamespaces(bin string, idBase uint32) error {
	if os.Geteuid() != 0 {
		// The overlay root needs a mount namespace made without a user
		// namespace, which takes CAP_SYS_ADMIN on the host.
		return errors.New("the gateway must run as root (uid 0) for the namespace sandbox")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return errors.New("user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	// Through a descriptor: sandbox root may not be able to reach bin by
	// its path (setup, as host root, starts init the same way, from
	// /proc/self/exe).
	f, err := os.Open(bin)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.Command("/proc/self/fd/3", jail.ProbeArg)
	cmd.ExtraFiles = []*os.File{f}
	cmd.Env = []string{}
	cmd.SysProcAttr = jail.SandboxAttr(idBase)
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(out) > 0 {
			return errors.New(strings.TrimSpace(string(out)))
		}
		return fmt.Errorf("create user, pid, mount, net, uts and ipc namespaces: %w", err)
	}
	return nil
}

// Name returns "local".
func (l *Local) Name() string { return "local" }

var idPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// locked is lookup with the sandbox's lock held, ErrNotFound once it was
// deleted. The caller unlocks sb.mu.
func (l *Local) locked(id string) (*sandbox, error) {
	sb, err := l.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	if sb.deleted {
		sb.mu.Unlock()
		return nil, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	return sb, nil
}

// lookup returns the sandbox id, adopting it from disk if this process has
// not seen it. ErrNotFound if there is none.
func (l *Local) lookup(id string) (*sandbox, error) {
	if !idPattern.MatchString(id) {
		return nil, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if sb := l.boxes[id]; sb != nil {
		return sb, nil
	}
	if l.creating[id] {
		return nil, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	dir := filepath.Join(l.boxesDir, id)
	st, err := readState(dir)
	if err != nil {
		return nil, providers.Wrap(providers.ErrNotFound, err, "sandbox "+id+" not found")
	}
	sb := &sandbox{id: id, dir: dir, st: st}
	sb.watch()
	l.boxes[id] = sb
	return sb, nil
}

// state is the sandbox's state as the kernel sees it: error if init
// ended on its own and how is known (see exit.go), stopped if not.
func (sb *sandbox) state() providers.State {
	if !alive(sb.st.Pid, sb.st.StartTime) {
		if sb.exitReason() != "" {
			return providers.StateError
		}
		return providers.StateStopped
	}
	if fz := sb.st.Cgroups["freezer"]; fz != "" {
		s, err := freezerState(fz)
		if err != nil {
			return providers.StateUnknown
		}
		if s != "THAWED" {
			return providers.StatePaused
		}
		return providers.StateRunning
	}
	if _, err := os.Stat(sb.dir + "/" + pausedFile); err == nil {
		return providers.StatePaused
	}
	return providers.StateRunning
}

// running returns the sandbox id if it can take a command or a file now:
// ErrNotFound if unknown, ErrConflict if paused or stopped.
func (l *Local) running(id string) (*sandbox, error) {
	sb, err := l.lookup(id)
	if err != nil {
		return nil, err
	}
	if s := sb.state(); s != providers.StateRunning {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, s)
	}
	return sb, nil
}

// Status reports running, paused, error (init ended on its own, or its
// agent broke the protocol; see StateReason) or stopped (init is
// gone, and how is not known).
func (l *Local) Status(ctx context.Context, id string) (providers.State, error) {
	sb, err := l.lookup(id)
	if err != nil {
		return "", err
	}
	st := sb.state()
	if st == providers.StateRunning && sb.hostViolation() != "" {
		return providers.StateError, nil
	}
	return st, nil
}

// List reports every sandbox under the state directory, including those
// made by an earlier process. A directory without a usable state file (a
// create cut short by a crash) is reported in state error, so the service
// can delete it.
func (l *Local) List(ctx context.Context) ([]providers.Owned, error) {
	entries, err := os.ReadDir(l.boxesDir)
	if err != nil {
		return nil, providers.Wrap(providers.ErrUnavailable, err, "cannot read the state directory")
	}
	var out []providers.Owned
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || strings.HasPrefix(id, ".") || !idPattern.MatchString(id) {
			continue
		}
		l.mu.Lock()
		creating := l.creating[id]
		l.mu.Unlock()
		if creating {
			continue
		}
		sb, err := l.lookup(id)
		if err != nil {
			out = append(out, providers.Owned{ID: id, State: providers.StateError})
			continue
		}
		out = append(out, providers.Owned{ID: id, State: sb.state()})
	}
	return out, nil
}

// Ping reports whether the state directory is usable.
func (l *Local) Ping(ctx context.Context) error {
	if _, err := os.Stat(l.boxesDir); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "state directory unavailable")
	}
	return nil
}

// Close makes later Creates fail. Sandboxes keep running; a later New on
// the same state directory adopts them.
func (l *Local) Close() error {
	l.mu.Lock()
	l.closed = true
	boxes := make([]*sandbox, 0, len(l.boxes))
	for _, sb := range l.boxes {
		boxes = append(boxes, sb)
	}
	l.mu.Unlock()
	for _, sb := range boxes {
		sb.dropHost()
		sb.unwatch()
	}
	// The egress point goes with the provider: sandboxes keep running
	// without a way out until a new gateway restores their policies.
	l.egress.Close()
	l.disks.close()
	return nil
}

// openRoot opens the sandbox's root directory (O_PATH) for path resolution;
// ErrConflict if init is gone.
func (sb *sandbox) openRoot() (*os.File, error) {
	if sb.st.Isolation == IsolationNone {
		return os.OpenFile(sb.dir+"/fs", unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	// /proc/<pid>/root is init's root, with the sandbox's mounts. Checking
	// identity on both sides of the open rules out a recycled pid.
	if !alive(sb.st.Pid, sb.st.StartTime) {
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is stopped", sb.id)
	}
	f, err := os.OpenFile("/proc/"+strconv.Itoa(sb.st.Pid)+"/root", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil || !alive(sb.st.Pid, sb.st.StartTime) {
		if f != nil {
			f.Close()
		}
		return nil, providers.Errorf(providers.ErrConflict, "sandbox %s is stopped", sb.id)
	}
	return f, nil
}
