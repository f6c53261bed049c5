package jail

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/agent"
)

// The hidden subcommands. The gateway executes its init binary
// (Options.InitBinary: sandgate-agent, or its own, /proc/self/exe) with
// one of these as os.Args[1]; this package's init function catches them
// before main (or TestMain) runs, so the same mechanism works from any
// binary that links this package: the agent, the gateway, test binaries.
const (
	SetupArg = "__sandgate-local-setup" // privileged mount ns: clone / for the overlay, start init
	InitArg  = "__sandgate-local-init"  // the sandbox's init and agent
	ProbeArg = "__sandgate-local-probe" // New: can we create the namespaces at all?
)

// Descriptors handed to setup and init (after stdin, stdout, stderr).
const (
	fdListener = 3 // the agent's listening socket, bound by the gateway
	fdReady    = 4 // write end of the readiness pipe
	fdConfig   = 5 // read end of a pipe holding the Config JSON
	// FDDisk is setup's descriptor of a disk made ahead (Config.DiskFD):
	// the fourth of the extra files.
	FDDisk = 6
	// FDPids is setup's descriptor of the sandbox's pids cgroup's tasks
	// file (Config.PidsFD), the fifth of the extra files; init gets it
	// as fdInitPids.
	FDPids     = 7
	fdInitPids = 6
)

// nsFlags are the namespaces of a sandbox. The cgroup namespace is rooted
// at the sandbox's own cgroups, which setup joins before starting init.
const nsFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS |
	syscall.CLONE_NEWNET | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWCGROUP

// Config is what setup and init are told. It travels through a pipe,
// not argv, because a sandbox's ps shows init's command line and the
// config names host paths.
//
// With namespaces, setup prepares in the sandbox's directory (dir):
// lower/ (the id-mapped, read-only root image: a host view or an image),
// ro/<name> (id-mapped, read-only host directories to bind at /<name>),
// rw/ (the sandbox's own filesystem when it has a disk limit) with
// rw/layer/upper and rw/layer/work, layer<i>/ (the snapshot layers a sandbox made from
// a snapshot stacks above lower/), and root/ (where init mounts the
// overlay). dir is
// owned by the sandbox's root and is init's working directory, so init
// reaches all of it by relative paths without the right to traverse the
// provider's state directory.
type Config struct {
	ID        string   `json:"id"`
	Dir       string   `json:"dir"`     // the sandbox's state directory (host path)
	Private   []string `json:"private"` // host directories covered inside the sandbox
	Workdir   string   `json:"workdir"` // created if missing
	Isolation string   `json:"isolation"`

	IDBase        uint32            `json:"id_base"`              // host id of sandbox root
	Lower         string            `json:"lower"`                // host view skeleton or image root
	Image         bool              `json:"image,omitempty"`      // Lower is an image: keep its setuid bits
	Binds         []string          `json:"binds,omitempty"`      // host top-level directories bound read-only
	DiskBytes     int64             `json:"disk_bytes,omitempty"` // 0: no filesystem of its own
	DiskFS        string            `json:"disk_fs,omitempty"`    // its kind (FSBtrfs, FSExt4)
	Mkfs          string            `json:"mkfs,omitempty"`
	Layers        []Layer           `json:"layers,omitempty"`         // snapshot layers, the newest first, above Lower
	DiskTemplates string            `json:"disk_templates,omitempty"` // formatted empty filesystems, one per size
	Cgroups       map[string]string `json:"cgroups,omitempty"`        // joined by setup, so init starts inside
	ShmBytes      int64             `json:"shm_bytes"`
	Volumes       []VolumeBind      `json:"volumes,omitempty"` // staged by setup at vol<i>/, bound by init
	Env           map[string]string `json:"env,omitempty"`     // the sandbox's environment, for terminal sessions
	// Seccomp is the filter every command runs under (package
	// seccomp's Compile): the gateway compiles it, so that init links
	// no profile library.
	Seccomp []byte `json:"seccomp,omitempty"`
	// DiskFD says the sandbox's filesystem was made ahead (MakeDisk, its
	// image already at dir/disk.img): setup gets it at FDDisk, a detached
	// mount, instead of making one.
	DiskFD bool `json:"disk_fd,omitempty"`
	// PidsFD says setup holds the sandbox's pids cgroup's tasks file,
	// opened for writing by the gateway (FDPids): init's forker thread
	// joins that cgroup by writing "0" to it, which moves the thread
	// alone, where the gateway moving it by its id would take the
	// kernel's whole-process migration lock (an RCU grace period, ~10
	// ms). The gateway's credentials from the open are what the kernel
	// checks. Init closes it before it answers.
	PidsFD bool `json:"pids_fd,omitempty"`
	// Hostname is the sandbox's UTS host name; "": DefaultHostname.
	Hostname string `json:"hostname,omitempty"`
	// CapAdd are capabilities (names without CAP_) commands keep that
	// are dropped by default (droppedCaps).
	CapAdd []string `json:"cap_add,omitempty"`
}

// ReadyMsg is one line on the readiness pipe: setup reports init's pid,
// init reports ready or an error.
type ReadyMsg struct {
	Pid   int    `json:"pid,omitempty"`
	Ready bool   `json:"ready,omitempty"`
	Error string `json:"error,omitempty"`
}

func init() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case SetupArg:
		os.Exit(runSetup())
	case InitArg:
		os.Exit(runInit())
	case ProbeArg:
		os.Exit(runProbe())
	}
}

// SandboxAttr is how init is started in a fresh set of namespaces, as the
// root of the id range that starts at base. The range does not hold the
// caller's uid, so init's credentials are set explicitly: without that
// it would run as the overflow uid with no capabilities.
func SandboxAttr(base uint32) *syscall.SysProcAttr {
	idmap := idMapping(base)
	return &syscall.SysProcAttr{
		Cloneflags:                 nsFlags,
		UidMappings:                idmap,
		GidMappings:                idmap,
		GidMappingsEnableSetgroups: true, // commands run with their user's supplementary groups
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
		Setsid:                     true,
	}
}

// writeReady writes one line (under PIPE_BUF: atomic) and reports whether
// it went through.
func writeReady(f *os.File, m ReadyMsg) bool {
	b, _ := json.Marshal(m)
	_, err := f.Write(append(b, '\n'))
	return err == nil
}

// runSetup starts init and exits, so init is orphaned from the start and
// survives the gateway. With namespaces it runs as host root in a new
// mount namespace of its own (no user namespace: an overlay refuses a
// lower layer with locked submounts, which is what a clone made inside the
// user namespace would have) and prepares what init mounts (see
// Config); none of it is visible on the host.
func runSetup() int {
	ready := os.NewFile(fdReady, "ready")
	fail := func(err error) int {
		writeReady(ready, ReadyMsg{Error: err.Error()})
		return 1
	}
	cfg, raw, err := readConfig()
	if err != nil {
		return fail(err)
	}
	if cfg.DiskFD {
		// Init and its commands must never hold it.
		unix.CloseOnExec(FDDisk)
	}
	var pids *os.File
	if cfg.PidsFD {
		unix.CloseOnExec(FDPids) // init gets it below, as fdInitPids
		pids = os.NewFile(FDPids, "pids-tasks")
	}
	// Only this thread joins the sandbox's cgroups, and forks init from
	// there: a child starts in its forking thread's cgroups. Moving one's
	// own thread (0 in tasks) skips the whole-process migration lock,
	// which costs an RCU grace period (~10 ms) per create.
	runtime.LockOSThread() // for good: setup exits soon after
	for ctrl, dir := range cfg.Cgroups {
		if err := os.WriteFile(dir+"/tasks", []byte("0"), 0); err != nil {
			return fail(fmt.Errorf("join %s cgroup: %w", ctrl, err))
		}
	}
	// Init waits for its config, which is written once its root's layers
	// are in place (see mountLayers).
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer cfgW.Close()
	cmd := exec.Command("/proc/self/exe", InitArg)
	cmd.Env = []string{}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{os.NewFile(fdListener, "listener"), ready, cfgR}
	if pids != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, pids) // fdInitPids
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	disk := -1 // the sandbox's filesystem, a detached mount
	if cfg.Isolation == IsolationNamespaces {
		if disk, err = stageRoot(cfg); err != nil {
			return fail(err)
		}
		cmd.SysProcAttr = SandboxAttr(cfg.IDBase)
	}
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start init: %w", err))
	}
	cfgR.Close()
	// Reported at once, so that whatever happens next the gateway can
	// clean up after init.
	writeReady(ready, ReadyMsg{Pid: cmd.Process.Pid})
	if cfg.Isolation == IsolationNamespaces {
		if err := mountLayers(cfg, cmd.Process.Pid, disk); err != nil {
			// Init reads no config and exits.
			return fail(err)
		}
	}
	if _, err := cfgW.Write(raw); err != nil {
		return fail(fmt.Errorf("hand init its config: %w", err))
	}
	return 0
}

// stageRoot is setup's part of the namespaced sandbox before init starts
// (setup has joined the sandbox's cgroups already: init inherits them, and
// its cgroup namespace is rooted there). It binds dir onto itself as a
// shared mount, so that what is mounted under it later reaches init's
// mount namespace too (a copy owned by a less privileged user namespace
// receives a shared mount's events as a slave); makes the sandbox's
// filesystem (returned as a detached mount, or -1 without a disk limit);
// hands dir to sandbox root; and makes dir the working directory init
// starts in.
func stageRoot(cfg Config) (int, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount(cfg.Dir, cfg.Dir, "", unix.MS_BIND, ""); err != nil {
		return -1, fmt.Errorf("bind the sandbox directory: %w", err)
	}
	if err := unix.Mount("", cfg.Dir, "", unix.MS_SHARED, ""); err != nil {
		return -1, fmt.Errorf("share the sandbox directory: %w", err)
	}
	base := int(cfg.IDBase)
	rw := cfg.Dir + "/rw"
	disk := -1
	dirs := []string{rw, cfg.Dir + "/root", cfg.Dir + "/lower", cfg.Dir}
	if cfg.DiskFD {
		disk = FDDisk
	} else if cfg.DiskBytes > 0 {
		var err error
		if disk, err = makeDisk(cfg.DiskFS, cfg.Mkfs, cfg.DiskTemplates, cfg.Dir, cfg.DiskBytes); err != nil {
			return -1, err
		}
	} else {
		// Upper and work on the state directory's filesystem, as the
		// sandbox's root (not id-mapped).
		dirs = append(dirs, rw+"/"+LayerDir, rw+"/"+upperDir, rw+"/"+workDir)
	}
	for i := range cfg.Layers {
		dirs = append(dirs, fmt.Sprintf("%s/layer%d", cfg.Dir, i))
	}
	for _, name := range cfg.Binds {
		dirs = append(dirs, cfg.Dir+"/ro/"+name)
	}
	for i := range cfg.Volumes {
		dirs = append(dirs, cfg.Dir+"/"+volDir(i))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return -1, err
		}
		if err := os.Chown(d, base, base); err != nil {
			return -1, err
		}
	}
	// Init, started with this working directory (the bind, not what it
	// covers), reaches everything by relative paths.
	return disk, os.Chdir(cfg.Dir)
}

// mountLayers mounts the id-mapped layers of the sandbox's root under
// dir, mapped through init's own user namespace (so no process is needed
// to hold one): the read-only root image at lower/ and host directories
// at ro/<name>, the snapshot layers at layer<i>/ (read-only), and the
// sandbox's own filesystem (disk, unless -1) at rw/. They reach init's
// mount namespace through the shared bind stageRoot made.
func mountLayers(cfg Config, initPid, disk int) error {
	userns, err := os.Open("/proc/" + strconv.Itoa(initPid) + "/ns/user")
	if err != nil {
		return fmt.Errorf("open init's user namespace: %w", err)
	}
	defer userns.Close()
	var nosuid uint64 = unix.MOUNT_ATTR_NOSUID
	if cfg.Image {
		nosuid = 0 // an image's setuid programs are the image's business
	}
	if err := mountIdmapped(cfg.Lower, cfg.Dir+"/lower", userns, nosuid); err != nil {
		return err
	}
	for _, name := range cfg.Binds {
		if err := mountIdmapped("/"+name, cfg.Dir+"/ro/"+name, userns, unix.MOUNT_ATTR_NOSUID); err != nil {
			return err
		}
	}
	for i, ly := range cfg.Layers {
		fd, err := ly.Mount()
		if err != nil {
			return err
		}
		err = attachIdmapped(fd, fmt.Sprintf("%s/layer%d", cfg.Dir, i), userns, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	if disk >= 0 {
		defer unix.Close(disk)
		if err := attachIdmapped(disk, cfg.Dir+"/rw", userns, unix.MOUNT_ATTR_NOSUID); err != nil {
			return err
		}
	}
	return mountVolumes(cfg, userns)
}

// runInit is the sandbox's init: it builds the root filesystem (in
// isolation "namespaces"), then serves the agent protocol until killed.
func runInit() int {
	ready := os.NewFile(fdReady, "ready")
	fail := func(err error) int {
		writeReady(ready, ReadyMsg{Error: err.Error()})
		return 1
	}
	// A Go program's default handlers exit on these; a namespace init is
	// only shielded from signals it leaves at SIG_DFL, so without this a
	// `kill -TERM 1` inside would end the sandbox. Notify, not Ignore: an
	// ignored disposition would be inherited by every command.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for range sigs {
		}
	}()
	// A signal that crashes a Go program (SIGSEGV and the like), sent
	// from inside, ends the sandbox as it always did, but in a way the
	// gateway can name: see InitFatalSignals. A real fault in init still
	// crashes it through the runtime.
	fatal := make(chan os.Signal, 1)
	signal.Notify(fatal, InitFatalSignals...)
	go func() {
		sig := (<-fatal).(syscall.Signal)
		fmt.Fprintf(os.Stderr, "sandgate init: %s sent from inside the sandbox: exiting\n", unix.SignalName(sig))
		os.Exit(InitSignalExit + int(sig))
	}()

	cfg, _, err := readConfig()
	if err != nil {
		return fail(err)
	}
	// The memory cgroup's files are the host's: opened before the pivot
	// hides them, kept (close-on-exec) for the agent's OOM accounting.
	mem := openMemoryCgroup(cfg.Cgroups["memory"])
	// So are those the agent's metrics read (memory, cpu, cpuacct).
	cg := agent.OpenCgroupV1(cfg.Cgroups)
	if cfg.Isolation == IsolationNamespaces {
		if err := setupRoot(cfg); err != nil {
			return fail(err)
		}
		// Non-dumpable: together with CAP_SYS_PTRACE leaving the commands'
		// bounding set, no command can ptrace init and borrow its
		// CAP_SYS_ADMIN.
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			return fail(fmt.Errorf("set non-dumpable: %w", err))
		}
	} else {
		// Without a pid namespace, orphans would go to host PID 1; as a
		// subreaper init keeps them, so Delete can find and kill them.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fail(fmt.Errorf("become subreaper: %w", err))
		}
	}

	lf := os.NewFile(fdListener, "listener")
	l, err := net.FileListener(lf) // dups with O_CLOEXEC
	lf.Close()                     // fd 3 is not close-on-exec: commands must not inherit it
	if err != nil {
		return fail(fmt.Errorf("agent socket: %w", err))
	}
	a := newInitServer(cfg)
	a.mem, a.cg = mem, cg
	if err := a.start(); err != nil {
		return fail(err)
	}
	// If the gateway gave up waiting, nobody will ever use this sandbox.
	if !writeReady(ready, ReadyMsg{Ready: true}) {
		return 1
	}
	ready.Close()
	a.serve(l)
	return 1
}

// readConfig reads the config from fdConfig and closes it.
func readConfig() (Config, []byte, error) {
	f := os.NewFile(fdConfig, "config")
	defer f.Close()
	var cfg Config
	raw, err := io.ReadAll(f)
	if err == nil {
		err = json.Unmarshal(raw, &cfg)
	}
	if err != nil {
		return cfg, nil, fmt.Errorf("read config: %w", err)
	}
	return cfg, raw, nil
}

// runProbe runs inside a fresh set of sandbox namespaces and checks that
// mounting works there.
func runProbe() int {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		fmt.Fprintf(os.Stderr, "make / private in the new mount namespace: %v", err)
		return 1
	}
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", 0, "size=4k"); err != nil {
		fmt.Fprintf(os.Stderr, "mount tmpfs in the new user namespace: %v", err)
		return 1
	}
	return 0
}

// Isolation modes.
const (
	IsolationNamespaces = "namespaces"
	IsolationNone       = "none"
)
