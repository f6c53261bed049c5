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
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/rootfs"
)

// Isolation modes.
const (
	IsolationNamespaces = "namespaces"
	IsolationNone       = "none"
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
	DefaultDiskGiB   int64
	// PidsMax is each sandbox's process limit (0: the host's pid_max/16);
	// all sandboxes together get at most half of pid_max.
	PidsMax int64
	// ShmMiB sizes /dev/shm (0: DefaultShmMiB).
	ShmMiB int64
	// Images is the directory of images a create may name (absolute, or
	// relative to it): root filesystem directories, `docker save` or OCI
	// layout tarballs (unpacked once into <StateDir>/image-cache). Only
	// what is under it can be an image: the administrator's choice, never
	// an arbitrary host path. "" refuses every image.
	Images string
	// Private lists more host directories no sandbox may see (the
	// gateway's state directory with its lease key and store), besides
	// StateDir. A sandbox's view of the host does not hold them unless they
	// are under a directory it gets (/usr, /opt, /etc); there they are
	// covered by an empty read-only directory.
	Private []string
}

// Local is the local provider. It is safe for concurrent use. It holds no
// goroutines and no processes of its own: sandboxes outlive it.
type Local struct {
	stateDir  string // absolute, symlinks resolved
	boxesDir  string // <stateDir>/sandboxes
	isolation string
	log       *slog.Logger

	idBase  uint32
	private []string // host directories covered in every sandbox: StateDir and Options.Private
	images  string   // Options.Images, absolute; "" without
	store   *rootfs.Store
	view    hostView // the root image of sandboxes without one (namespaces only)
	mkfs    string   // mkfs.ext4, "" if disk limits cannot be made
	limits  providers.Resources
	pidsMax int64
	shm     int64 // bytes

	mu       sync.Mutex
	boxes    map[string]*sandbox // known sandboxes: created here or adopted from disk
	creating map[string]bool     // ids whose Create is in progress
	ranges   map[int]string      // id ranges in use (index -> sandbox id), see idmap.go
	closed   bool
}

var (
	_ providers.Provider = (*Local)(nil)
	_ providers.Pauser   = (*Local)(nil)
)

// sandbox is one sandbox as the gateway knows it.
type sandbox struct {
	id  string
	dir string
	st  persisted

	// mu serialises the state changes: Pause, Resume, Delete.
	mu      sync.Mutex
	deleted bool // guarded by mu; a deleted sandbox is also gone from Local.boxes
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
	if uint64(opts.IDBase)+maxRanges*idMapSize > 1<<32-2 {
		return nil, fmt.Errorf("local: id base %d leaves no room for %d ranges of %d ids", opts.IDBase, maxRanges, idMapSize)
	}
	if opts.Isolation == IsolationNamespaces {
		if err := probeNamespaces(opts.IDBase); err != nil {
			return nil, fmt.Errorf("local: namespaces unavailable (use isolation %q to run without): %w", IsolationNone, err)
		}
	}
	l := &Local{
		stateDir:  dir,
		boxesDir:  dir + "/sandboxes",
		isolation: opts.Isolation,
		log:       opts.Logger,
		idBase:    opts.IDBase,
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
		if l.store, err = rootfs.Open(dir + "/image-cache"); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
	}
	if l.isolation == IsolationNamespaces {
		viewsDir := dir + "/views"
		if err := os.MkdirAll(viewsDir, 0o700); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		if l.view, err = buildView(viewsDir); err != nil {
			return nil, fmt.Errorf("local: build the host view: %w", err)
		}
		views[l.view.dir] = true
		pruneViews(viewsDir, views)
		if err := ensurePidsParent(hostPidMax() / 2); err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
	}
	l.removeTrash()
	return l, nil
}

// setLimits fills in the default limits from opts.
func (l *Local) setLimits(opts Options) error {
	mem, disk := opts.DefaultMemoryMiB, opts.DefaultDiskGiB
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
		l.pidsMax = max(hostPidMax()/16, 64)
	}
	l.shm = opts.ShmMiB << 20
	if l.shm <= 0 {
		l.shm = DefaultShmMiB << 20
	}
	if l.isolation == IsolationNamespaces {
		mkfs, err := findMkfs()
		if err != nil && disk > 0 {
			return fmt.Errorf("local: disk limits cannot be enforced (%v); set the default disk limit to none to run without", err)
		}
		l.mkfs = mkfs
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

// probeNamespaces starts a process in a fresh set of sandbox namespaces and
// reports why that failed, if it did.
func probeNamespaces(idBase uint32) error {
	if os.Geteuid() != 0 {
		// The overlay root needs a mount namespace made without a user
		// namespace, which takes CAP_SYS_ADMIN on the host.
		return errors.New("the gateway must run as root (uid 0) for the namespace sandbox")
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && strings.TrimSpace(string(b)) == "0" {
		return errors.New("user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	cmd := exec.Command("/proc/self/exe", probeArg)
	cmd.Env = []string{}
	cmd.SysProcAttr = sandboxAttr(idBase)
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

func validateSpec(spec providers.CreateSpec) error {
	var problems []string
	if !idPattern.MatchString(spec.ID) {
		problems = append(problems, "sandbox id must be 1-63 lowercase letters, digits or dashes")
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range spec.Options {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		problems = append(problems, fmt.Sprintf("unknown provider option %q (local takes none)", k))
	}
	if spec.Workdir != "" && (!filepath.IsAbs(spec.Workdir) || filepath.Clean(spec.Workdir) != spec.Workdir) {
		problems = append(problems, "workdir must be an absolute, clean path")
	}
	if err := validateEnv(spec.Env); err != nil {
		problems = append(problems, err.Error())
	}
	r := spec.Resources
	if r.CPU != nil && *r.CPU <= 0 {
		problems = append(problems, "resources.cpu must be positive")
	}
	if r.MemoryMiB != nil && *r.MemoryMiB <= 0 {
		problems = append(problems, "resources.memory_mib must be positive")
	}
	if r.DiskGiB != nil && *r.DiskGiB < 0 {
		problems = append(problems, "resources.disk_gib must not be negative")
	}
	if (r.GPU != nil && *r.GPU > 0) || (r.GPUType != nil && *r.GPUType != "") {
		problems = append(problems, "the local provider has no GPUs")
	}
	if len(problems) > 0 {
		return providers.Errorf(providers.ErrInvalid, "%s", strings.Join(problems, "; "))
	}
	return nil
}

func validateEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("invalid environment variable %q", k)
		}
	}
	return nil
}

// Create makes a sandbox and returns once its agent answers. Options must
// be empty. A resource the spec leaves unset (or disk_gib 0) gets the
// provider's default limit. On error nothing is left behind.
func (l *Local) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if err := validateSpec(spec); err != nil {
		return providers.Sandbox{}, err
	}
	if spec.Workdir == "" {
		spec.Workdir = defaultWorkdir
	}
	if spec.ReadyTimeout <= 0 {
		spec.ReadyTimeout = defaultReadyTimeout
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return providers.Sandbox{}, providers.Errorf(providers.ErrUnavailable, "provider is closed")
	}
	if l.creating[spec.ID] || l.boxes[spec.ID] != nil {
		l.mu.Unlock()
		return providers.Sandbox{}, providers.Errorf(providers.ErrConflict, "sandbox %s already exists", spec.ID)
	}
	var idBase uint32
	if l.isolation == IsolationNamespaces {
		var err error
		if idBase, err = l.allocRange(spec.ID); err != nil {
			l.mu.Unlock()
			return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "no id range left for a sandbox")
		}
	}
	l.creating[spec.ID] = true
	l.mu.Unlock()
	ok := false
	defer func() {
		l.mu.Lock()
		delete(l.creating, spec.ID)
		l.mu.Unlock()
		if !ok {
			l.freeRange(idBase)
		}
	}()
	res := l.withDefaults(spec.Resources)

	dir := filepath.Join(l.boxesDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return providers.Sandbox{}, providers.Errorf(providers.ErrConflict, "sandbox %s already exists", spec.ID)
		}
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot create sandbox directory")
	}
	st := persisted{ID: spec.ID, Isolation: l.isolation, Workdir: spec.Workdir, Env: spec.Env, Created: time.Now().UTC(), IDBase: idBase}
	defer func() {
		if !ok {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
			defer cancel()
			if err := destroy(ctx, dir, st); err != nil {
				l.log.Error("local: cleanup after failed create", "sandbox", spec.ID, "err", err)
			}
		}
	}()

	readyCtx, cancel := context.WithTimeout(ctx, spec.ReadyTimeout)
	defer cancel()
	cfg := initConfig{
		ID: spec.ID, Dir: dir, Private: l.private, Workdir: spec.Workdir, Isolation: l.isolation,
		IDBase: idBase, ShmBytes: l.shm,
	}
	cgroups, skipped, err := createCgroups(spec.ID, res, l.pidsMax)
	if err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot apply resource limits")
	}
	st.Cgroups, cfg.Cgroups = cgroups, cgroups
	if len(skipped) > 0 {
		l.log.Warn("local: cgroup controllers not writable; limits not applied", "sandbox", spec.ID, "controllers", skipped)
	}
	var img rootfs.Image
	extra := map[string]any{"isolation": l.isolation}
	if spec.Image != "" {
		var found bool
		if img, found, err = l.image(ctx, spec.Image); err != nil {
			return providers.Sandbox{}, err
		}
		if found {
			// The image's environment (PATH and the like) under the request's.
			env := make(map[string]string, len(img.Config.Env)+len(spec.Env))
			for _, kv := range img.Config.Env {
				if k, v, ok := strings.Cut(kv, "="); ok {
					env[k] = v
				}
			}
			for k, v := range spec.Env {
				env[k] = v
			}
			st.Env, st.Image = env, spec.Image
		} else {
			extra["image"] = "ignored: not an image in the local image directory"
		}
	}
	if l.isolation == IsolationNamespaces {
		if res.DiskGiB != nil {
			cfg.DiskBytes, cfg.Mkfs, cfg.DiskTemplates = *res.DiskGiB<<30, l.mkfs, l.stateDir+"/disk-templates"
			if l.mkfs == "" {
				return providers.Sandbox{}, providers.Errorf(providers.ErrInvalid, "this host cannot enforce disk limits (no loop devices or mkfs.ext4)")
			}
		}
		cfg.Lower, cfg.Binds = l.view.dir, l.view.binds
		st.View = l.view.dir
		if img.Dir != "" {
			cfg.Lower, cfg.Binds, cfg.Image = img.Dir, nil, true
			st.View = ""
		}
		st.DiskBytes = cfg.DiskBytes
	}
	pid, err := l.startInit(readyCtx, dir, cfg, &st)
	if err != nil {
		return providers.Sandbox{}, err
	}
	ps, err := readProcStat("/proc", pid)
	if err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "sandbox init exited during start")
	}
	st.StartTime = ps.startTime
	if err := limitWithoutCgroup(pid, st.Cgroups, res); err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot apply resource limits")
	}
	if err := writeState(dir, st); err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "cannot record sandbox state")
	}
	sb := &sandbox{id: spec.ID, dir: dir, st: st}
	if err := sb.ping(readyCtx); err != nil {
		return providers.Sandbox{}, providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	if spec.Entrypoint != nil {
		if err := sb.spawn(readyCtx, spec.Entrypoint); err != nil {
			return providers.Sandbox{}, err
		}
	}
	l.mu.Lock()
	l.boxes[spec.ID] = sb
	l.mu.Unlock()
	ok = true
	return providers.Sandbox{ID: spec.ID, Workdir: spec.Workdir, Extra: extra}, nil
}

// image resolves a create's image name to a root filesystem under the
// image directory. ok is false for a name that is no image there (a
// registry reference, say): the local provider ignores it, as it always
// has, and the caller says so. ErrInvalid for an absolute path outside the
// directory or an unusable image.
func (l *Local) image(ctx context.Context, name string) (img rootfs.Image, ok bool, err error) {
	if l.store == nil {
		return img, false, nil
	}
	p := name
	if !filepath.IsAbs(p) {
		p = filepath.Join(l.images, p)
	}
	p = filepath.Clean(p)
	if !strings.HasPrefix(p, l.images+"/") {
		if filepath.IsAbs(name) {
			return img, false, providers.Errorf(providers.ErrInvalid, "image %q: the local provider runs images from its image directory only", name)
		}
		return img, false, nil
	}
	img, err = l.store.Resolve(ctx, p)
	msg := func() string { return strings.ReplaceAll(err.Error(), l.images+"/", "") }
	switch {
	case err == nil:
		return img, true, nil
	case errors.Is(err, rootfs.ErrNotFound) && !filepath.IsAbs(name):
		return img, false, nil
	case errors.Is(err, rootfs.ErrNotFound), errors.Is(err, rootfs.ErrInvalid), errors.Is(err, rootfs.ErrNotLocal):
		return img, false, providers.Errorf(providers.ErrInvalid, "%s", msg())
	}
	return img, false, providers.Wrap(providers.ErrUnavailable, err, "cannot unpack the image")
}

// withDefaults is r with the provider's default limits where r sets none.
func (l *Local) withDefaults(r providers.Resources) providers.Resources {
	if r.MemoryMiB == nil {
		r.MemoryMiB = l.limits.MemoryMiB
	}
	if r.CPU == nil {
		r.CPU = l.limits.CPU
	}
	if r.DiskGiB == nil || *r.DiskGiB == 0 {
		r.DiskGiB = l.limits.DiskGiB
	}
	return r
}

// startInit starts the sandbox's init through the setup process and waits
// until init reports ready. It records init's pid in st as soon as it is
// known, so a failed start can be cleaned up.
func (l *Local) startInit(ctx context.Context, dir string, cfg initConfig, st *persisted) (int, error) {
	subdirs := []string{"lower", "root", "rw"}
	if cfg.Isolation == IsolationNone {
		subdirs = []string{"fs", "fs" + cfg.Workdir}
	}
	for _, d := range subdirs {
		if err := os.MkdirAll(dir+"/"+d, 0o755); err != nil {
			return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create sandbox directory")
		}
	}
	lf, err := listenAgent(dir)
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create agent socket")
	}
	defer lf.Close()
	logf, err := os.OpenFile(dir+"/"+logName, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create init log")
	}
	defer logf.Close()
	rr, rw, err := os.Pipe()
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create readiness pipe")
	}
	defer rr.Close()
	arg, _ := json.Marshal(cfg)

	cfgR, err := configPipe(arg)
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot create config pipe")
	}
	defer cfgR.Close()

	cmd := exec.Command("/proc/self/exe", setupArg)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{lf, rw, cfgR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cfg.Isolation == IsolationNamespaces {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNS
	}
	err = cmd.Start()
	rw.Close()
	if err != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, err, "cannot start sandbox setup")
	}
	// The deadline follows ctx until the final drain below takes over.
	var mu sync.Mutex
	draining := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !draining {
			rr.SetReadDeadline(time.Now())
		}
	})
	defer stop()

	br := bufio.NewReader(rr)
	pid, err := readReady(br, st)
	if err == nil {
		// Setup exits right after starting init.
		cmd.Wait()
		return pid, nil
	}
	// Init may be running although readiness failed (a deadline, say):
	// setup reports its pid before exiting, so once setup is gone the pid
	// is in the pipe if it will ever be. destroy then kills init.
	if st.Pid == 0 {
		waitSetup(cmd)
		mu.Lock()
		draining = true
		rr.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		mu.Unlock()
		readReady(br, st)
	} else {
		waitSetup(cmd)
	}
	if ctx.Err() != nil {
		return 0, providers.Wrap(providers.ErrUnavailable, ctx.Err(), "sandbox did not become ready in time")
	}
	if tl := tail(dir + "/" + logName); tl != "" {
		err = fmt.Errorf("%w; init log: %s", err, tl)
	}
	return 0, providers.Wrap(providers.ErrUnavailable, err, "sandbox init failed")
}

// waitSetup waits for the setup process, which exits at once unless it
// is stuck in the kernel; then it is killed.
func waitSetup(cmd *exec.Cmd) {
	t := time.AfterFunc(5*time.Second, func() { cmd.Process.Kill() })
	cmd.Wait()
	t.Stop()
}

// readReady reads the readiness pipe until it has both init's ready and
// setup's report of init's pid (they race: setup writes after init has
// started), or an error. It records the pid in st as soon as it arrives.
func readReady(br *bufio.Reader, st *persisted) (int, error) {
	ready := false
	for !ready || st.Pid == 0 {
		line, err := br.ReadBytes('\n')
		if err != nil {
			return 0, fmt.Errorf("init exited before ready: %w", err)
		}
		var m readyMsg
		if err := json.Unmarshal(line, &m); err != nil {
			return 0, fmt.Errorf("readiness pipe: %w", err)
		}
		switch {
		case m.Error != "":
			return 0, errors.New(m.Error)
		case m.Pid > 0:
			st.Pid = m.Pid
		case m.Ready:
			ready = true
		}
	}
	return st.Pid, nil
}

// tail returns the end of a log file, for error causes (never shown to
// clients).
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// sockAddr is the agent socket's path, shortened through /proc/self/fd
// when it would not fit a sockaddr_un; the returned file (if any) must stay
// open while the path is used.
func sockAddr(dir string) (string, *os.File, error) {
	p := dir + "/" + socketName
	if len(p) < 100 {
		return p, nil, nil
	}
	d, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), socketName), d, nil
}

// listenAgent binds the agent's socket in dir and returns it as a file to
// hand to init.
func listenAgent(dir string) (*os.File, error) {
	addr, d, err := sockAddr(dir)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // the socket outlives this listener: init serves it
	f, err := ln.File()
	ln.Close()
	return f, err
}

// dial connects to the sandbox's agent.
func (sb *sandbox) dial(ctx context.Context) (*net.UnixConn, error) {
	addr, d, err := sockAddr(sb.dir)
	if err != nil {
		return nil, err
	}
	if d != nil {
		defer d.Close()
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unixpacket", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// call sends one request and reads its reply.
func (sb *sandbox) call(ctx context.Context, req request) (reply, error) {
	c, err := sb.dial(ctx)
	if err != nil {
		return reply{}, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if err := sendMsg(c, req); err != nil {
		return reply{}, err
	}
	var rep reply
	files, err := recvMsg(c, &rep)
	closeFiles(files)
	if err != nil {
		return reply{}, err
	}
	if rep.Error != "" {
		return rep, errors.New(rep.Error)
	}
	return rep, nil
}

func (sb *sandbox) ping(ctx context.Context) error {
	_, err := sb.call(ctx, request{Op: opPing})
	return err
}

// spawn starts argv in the background (the entrypoint), output discarded.
func (sb *sandbox) spawn(ctx context.Context, argv []string) error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	c, err := sb.dial(ctx)
	if err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	req := request{Op: opExec, Argv: argv, Env: envList(sb.st.Env, nil), Dir: sb.hostPath(sb.st.Workdir), Preserve: true}
	if err := sendMsg(c, req, null, null, null); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	var rep reply
	files, err := recvMsg(c, &rep)
	closeFiles(files)
	if err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "sandbox agent does not answer")
	}
	if rep.Error != "" {
		return providers.Errorf(providers.ErrInvalid, "entrypoint: %s", sb.clientMsg(rep.Error))
	}
	return nil
}

// hostPath is where a sandbox path is for the agent: itself with
// namespaces, under <dir>/fs without.
func (sb *sandbox) hostPath(p string) string {
	if sb.st.Isolation == IsolationNone {
		return sb.dir + "/fs" + p
	}
	return p
}

// clientMsg removes the host part of paths from an agent's message.
func (sb *sandbox) clientMsg(msg string) string {
	if sb.st.Isolation == IsolationNone {
		msg = strings.ReplaceAll(msg, sb.dir+"/fs", "")
	}
	return msg
}

// envList merges base and extra (extra wins) into a sorted KEY=VALUE list.
func envList(base, extra map[string]string) []string {
	m := make(map[string]string, len(base)+len(extra))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range extra {
		m[k] = v
	}
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
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
	l.boxes[id] = sb
	return sb, nil
}

// state is the sandbox's state as the kernel sees it.
func (sb *sandbox) state() providers.State {
	if !alive(sb.st.Pid, sb.st.StartTime) {
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

// Status reports running, paused or stopped (init is gone).
func (l *Local) Status(ctx context.Context, id string) (providers.State, error) {
	sb, err := l.lookup(id)
	if err != nil {
		return "", err
	}
	return sb.state(), nil
}

// Pause freezes every process of the sandbox: with the freezer cgroup when
// there is one, else by SIGSTOP to all of them (isolation "namespaces"
// only; ErrUnsupported otherwise). ErrConflict unless it is running.
func (l *Local) Pause(ctx context.Context, id string) error {
	return l.setPaused(ctx, id, true)
}

// Resume undoes Pause. ErrConflict unless the sandbox is paused.
func (l *Local) Resume(ctx context.Context, id string) error {
	return l.setPaused(ctx, id, false)
}

func (l *Local) setPaused(ctx context.Context, id string, pause bool) error {
	sb, err := l.lookup(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.deleted {
		return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	from, verb := providers.StateRunning, "pause"
	if !pause {
		from, verb = providers.StatePaused, "resume"
	}
	if s := sb.state(); s != from {
		return providers.Errorf(providers.ErrConflict, "cannot %s sandbox %s: it is %s", verb, id, s)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if fz := sb.st.Cgroups["freezer"]; fz != "" {
		want := "THAWED"
		if pause {
			want = "FROZEN"
		}
		if err := freeze(ctx, fz, want); err != nil {
			if pause {
				freeze(context.WithoutCancel(ctx), fz, "THAWED")
			}
			return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
		}
		return nil
	}
	if sb.st.Isolation != IsolationNamespaces {
		return providers.Errorf(providers.ErrUnsupported, "pause needs the freezer cgroup or isolation %q", IsolationNamespaces)
	}
	sig := syscall.SIGCONT
	if pause {
		sig = syscall.SIGSTOP
		// Mark first: an exec racing with the stop sees "paused" rather
		// than joining a half-stopped sandbox.
		if err := os.WriteFile(sb.dir+"/"+pausedFile, nil, 0o600); err != nil {
			return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
		}
	}
	if _, err := sb.call(ctx, request{Op: opSignal, Signal: int(sig)}); err != nil {
		return fmt.Errorf("%s sandbox %s: %w", verb, id, err)
	}
	if !pause {
		os.Remove(sb.dir + "/" + pausedFile)
	}
	return nil
}

// Delete kills the sandbox's processes and removes its cgroups and
// directory. ErrNotFound if there is no such sandbox (also the second
// time).
func (l *Local) Delete(ctx context.Context, id string) error {
	sb, err := l.lookup(id)
	if err != nil {
		return err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.deleted {
		return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	// Renaming claims the directory: from here on nobody finds the
	// sandbox, and a crash halfway leaves a .trash entry New cleans up.
	trash := filepath.Join(l.boxesDir, ".trash-"+id+"-"+randHex())
	if err := os.Rename(sb.dir, trash); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			l.forget(sb)
			return providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
		}
		return fmt.Errorf("delete %s: %w", id, err)
	}
	l.forget(sb)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	if err := destroy(ctx, trash, sb.st); err != nil {
		return fmt.Errorf("delete %s: %w", id, err)
	}
	l.freeRange(sb.st.IDBase)
	return nil
}

// forget drops sb from the cache; sb.mu is held.
func (l *Local) forget(sb *sandbox) {
	sb.deleted = true
	l.mu.Lock()
	if l.boxes[sb.id] == sb {
		delete(l.boxes, sb.id)
	}
	l.mu.Unlock()
}

func randHex() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// destroy kills what runs in the sandbox at dir (described by st, which may
// be partial) and removes its cgroups and dir.
func destroy(ctx context.Context, dir string, st persisted) error {
	var errs []error
	if st.Pid > 0 && (st.StartTime == 0 || alive(st.Pid, st.StartTime)) {
		if st.Isolation == IsolationNone {
			// No pid namespace takes the commands down with init.
			sb := &sandbox{dir: dir, st: st}
			kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			sb.call(kctx, request{Op: opKillAll})
			cancel()
		}
		if err := killInit(ctx, st); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroups(ctx, st.Cgroups); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killInit SIGKILLs init and waits (until ctx ends) for it to exit, which
// in a pid namespace takes every process of the sandbox with it.
func killInit(ctx context.Context, st persisted) error {
	fd, err := unix.PidfdOpen(st.Pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("pidfd_open init: %w", err)
	}
	defer unix.Close(fd)
	// The pidfd pins the pid: if it is still our init now, it is the one
	// signalled below.
	if st.StartTime != 0 && !alive(st.Pid, st.StartTime) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill init: %w", err)
	}
	// A frozen task dies only once thawed.
	if fz := st.Cgroups["freezer"]; fz != "" {
		os.WriteFile(fz+"/freezer.state", []byte("THAWED"), 0)
	}
	for {
		ms := 100
		if dl, ok := ctx.Deadline(); ok {
			ms = min(ms, max(int(time.Until(dl)/time.Millisecond), 0))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, ms)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for init: %w", err)
		}
		if ctx.Err() != nil {
			return errors.New("init did not exit")
		}
	}
}

// removeTrash finishes deletes that a previous process did not.
func (l *Local) removeTrash() {
	entries, _ := os.ReadDir(l.boxesDir)
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".trash-") {
			continue
		}
		dir := filepath.Join(l.boxesDir, e.Name())
		st, _ := readState(dir)
		ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
		if err := destroy(ctx, dir, st); err != nil {
			l.log.Warn("local: removing a half-deleted sandbox", "dir", dir, "err", err)
		} else {
			l.freeRange(st.IDBase)
		}
		cancel()
	}
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
	l.mu.Unlock()
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

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
