// Package providers holds the contract between the sandbox service and the
// backends that make sandboxes: the Provider interface, its optional
// capabilities, the types they exchange and the error kinds. One subpackage
// per backend implements it; providertest is the conformance suite every
// backend must pass.
package providers

import (
	"context"
	"io"
	"io/fs"
	"time"

	"github.com/sandgate/sandgate/internal/egress"
)

// State is a sandbox's lifecycle state; the strings are the API's.
type State string

const (
	StateStarting State = "starting"
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateStopped  State = "stopped"
	StateError    State = "error"
	StateUnknown  State = "unknown"
)

// Live reports whether a sandbox in state s holds backend resources.
func (s State) Live() bool {
	return s == StateStarting || s == StateRunning || s == StatePaused
}

// The contract's defaults (SPEC §4, §7), in one place. The service fills
// them in; a provider applies them only to a request that reaches it
// without them (a direct caller such as a test).
const (
	DefaultExecTimeout = 180 * time.Second
	DefaultMaxOutput   = 16 << 20 // bytes of stdout and of stderr kept per exec
	DefaultTERM        = "xterm-256color"
)

// Resources are the limits asked for at create. Nil means "provider default".
type Resources struct {
	CPU       *float64
	MemoryMiB *int64
	DiskGiB   *float64 // fractions allowed (0.5 = 512 MiB)
	GPU       *int64
	GPUType   *string
}

// CreateSpec is what the service asks a provider to make. The service has
// validated everything provider-neutral; the provider validates Image and
// Options (an unknown option key is ErrInvalid naming the key).
type CreateSpec struct {
	ID           string            // sbx-…, chosen by the service
	Image        string            // required by docker; local: a name in its image directory, "" for the host view
	Workdir      string            // absolute, cleaned; created if missing
	Env          map[string]string // environment of every process
	Resources    Resources
	Entrypoint   []string // nil = provider's keep-alive
	Ports        []int    // declared ports, 1..65535, unique
	Options      map[string]any
	ReadyTimeout time.Duration // >0
	// Snapshot, when set, is a snapshot of this provider (Snapshotter) the
	// sandbox starts from: its files replace the image's.
	Snapshot string
	// ShmBytes sizes the sandbox's /dev/shm, a tmpfs whose pages are the
	// sandbox's memory (1 MiB..MaxShmBytes, validated); 0: the
	// provider's default.
	ShmBytes int64
	// Volumes are mounted into the sandbox before it starts (see
	// VolumeMount); a provider that is no Volumer refuses volume mounts.
	Volumes []VolumeMount
	// Hostname is the sandbox's host name (a DNS label, validated); "":
	// the provider's default ("sandbox").
	Hostname string
	// CapAdd are capabilities (names without CAP_, upper case, validated
	// against the operator's allow-list) the sandbox's processes keep,
	// effective inside the sandbox's own namespaces only.
	CapAdd []string
	// Egress is the policy the create gave (nil: none was given; the
	// service applies it with SetEgress after Create) and Group the id
	// of the group it joins ("": none). A provider may shape the sandbox's
	// network by them: docker serves the ports of such a sandbox through
	// its egress point rather than a network of its own.
	Egress *egress.Policy
	Group  string
}

// MaxShmBytes is the largest /dev/shm a create may ask for.
const MaxShmBytes = 64 << 30

// Sandbox is what Create returns.
type Sandbox struct {
	ID      string
	Workdir string
	// Extra is returned to the client in SandboxRef.extra (e.g. the local
	// provider's isolation mode). Values must be JSON-encodable.
	Extra map[string]any
}

// Owned is one sandbox a provider holds, as List reports it.
type Owned struct {
	ID    string
	State State
}

// ExecRequest is one command. Paths are absolute (the service resolves them
// against the workdir).
type ExecRequest struct {
	Command            string            // run by bash -c when bash exists, else sh -c
	Cwd                string            // absolute; "" = the sandbox's workdir
	Env                map[string]string // added to the sandbox's env
	Timeout            time.Duration     // >0
	User               string            // name or numeric uid; "" = sandbox default (root inside)
	Stdin              []byte            // nil: stdin is /dev/null
	PreserveBackground bool              // false: processes the command leaves behind are killed when it returns
	MaxOutput          int               // cap per stream in bytes (>0); the rest is discarded

	// ID, when set, makes the command durable: the sandbox's agent holds
	// it under this id (its output and result, for Retain after it ends),
	// and a cancelled call leaves it running to its own timeout unless
	// KillOnDisconnect. Started, if set, is called once it runs.
	ID               string
	Retain           time.Duration
	KillOnDisconnect bool
	Started          func()
}

// ExecResult is the outcome of a command that ran (or timed out).
type ExecResult struct {
	Stdout, Stderr []byte
	// ExitCode is the command's status; 128+N when killed by signal N;
	// 125 when it timed out.
	ExitCode  int
	TimedOut  bool // the timeout fired and the process group was killed
	Truncated bool // a stream exceeded MaxOutput
	Duration  time.Duration
	// Usage is what the command used, where the provider can tell (nil
	// otherwise).
	Usage *ExecUsage
}

// ExecUsage is one command's accounting, measured inside the sandbox.
type ExecUsage struct {
	CPUTime    time.Duration // user + system, of the command and the processes it waited for
	PeakMemory int64         // bytes: peak RSS of the command or the largest process it waited for
	OOMKilled  bool          // killed for want of memory
}

// Provider makes and runs sandboxes. All methods are safe for concurrent
// use. Errors wrap the kinds in errors.go: ErrNotFound for a sandbox (or a
// file) it does not have, ErrConflict for a sandbox in the wrong state,
// ErrInvalid for bad input, ErrUnavailable when the backend cannot be
// reached. Any other error from Exec means the runtime failed.
type Provider interface {
	// Name is the provider's name: "local", "docker", "kubernetes".
	Name() string

	// Create makes a sandbox and returns once it can run a command and
	// take a file. On error it leaves nothing behind.
	Create(ctx context.Context, spec CreateSpec) (Sandbox, error)

	// Exec runs one command and waits for it. A non-zero exit is a result,
	// not an error. When ctx is cancelled the command's process group is
	// killed and ctx's error returned.
	Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error)

	// WriteFile streams r into the file at path (absolute), creating parent
	// directories and replacing an existing file. It returns the bytes
	// written. It never holds the whole file in memory.
	WriteFile(ctx context.Context, id, path string, r io.Reader) (int64, error)

	// ReadFile opens the regular file at path (absolute) for streaming and
	// returns its size. ErrNotFound if missing, ErrInvalid for a directory.
	// The caller closes the reader.
	ReadFile(ctx context.Context, id, path string) (io.ReadCloser, int64, error)

	// Status reports the sandbox's state as the backend sees it.
	Status(ctx context.Context, id string) (State, error)

	// Delete stops the sandbox and frees everything it holds. Deleting a
	// sandbox the provider does not have returns ErrNotFound.
	Delete(ctx context.Context, id string) error

	// List reports every sandbox this provider instance owns, live or not,
	// including those made before a restart.
	List(ctx context.Context) ([]Owned, error)

	// Ping reports whether the backend answers (for /readyz).
	Ping(ctx context.Context) error

	// Close releases the provider's own resources. Sandboxes keep running.
	Close() error
}

// Pauser is implemented by providers that can freeze a sandbox.
// Pause and Resume return ErrConflict when the sandbox is not in the
// state they leave.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// StateReasoner is implemented by providers that can say why a sandbox
// is in StateError.
type StateReasoner interface {
	StateReason(id string) string
}

// Endpoint is how a client reaches a port of a sandbox.
type Endpoint struct {
	URL     string
	Headers map[string]string
}

// Endpointer is implemented by providers that publish sandbox ports.
type Endpointer interface {
	// Endpoint returns how to reach port, which was declared at create.
	Endpoint(ctx context.Context, id string, port int) (Endpoint, error)
}

// ProcessSpec is a long-lived process for a terminal session.
type ProcessSpec struct {
	Command string            // run by bash -c (else sh -c); "" = an interactive login shell (bash if present, else sh)
	Cwd     string            // absolute; "" = the sandbox's workdir
	Env     map[string]string // added to the sandbox's env (TERM defaults to xterm-256color in TTY mode)
	User    string            // name or numeric uid; "" = sandbox default
	TTY     bool              // true: a PTY (stdout and stderr merged); false: three pipes
	Rows    uint16            // initial size in TTY mode; 0 = 24
	Cols    uint16            // 0 = 80
}

// FileInfo describes one file in a sandbox, as lstat sees it (a symlink
// is not followed).
type FileInfo struct {
	Name    string      `json:"name"`
	Type    FileType    `json:"type"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"` // the permission bits (and setuid, setgid, sticky)
	ModTime time.Time   `json:"mod_time"`
	Target  string      `json:"target,omitempty"` // a symlink's target, as written
}

// FileType is what a file is.
type FileType string

const (
	FileRegular FileType = "file"
	FileDir     FileType = "dir"
	FileSymlink FileType = "symlink"
	FileOther   FileType = "other" // a device, FIFO or socket
)

// MaxDirEntries caps a directory listing; a longer one is truncated.
const MaxDirEntries = 5000

// FileLister is implemented by providers that can describe files.
type FileLister interface {
	// StatFile describes the file at path (absolute). ErrNotFound if
	// missing.
	StatFile(ctx context.Context, id, path string) (FileInfo, error)
	// ListDir describes the entries of the directory at path (absolute),
	// sorted by name, at most MaxDirEntries of them (truncated says there
	// were more). ErrNotFound if missing, ErrInvalid if not a directory.
	ListDir(ctx context.Context, id, path string) (entries []FileInfo, truncated bool, err error)
}

// Snapshotter is implemented by providers that can capture a sandbox's
// filesystem (not its processes) and make sandboxes from it
// (CreateSpec.Snapshot).
type Snapshotter interface {
	// Snapshot captures sandbox id's filesystem as snapshot sid; the
	// sandbox keeps running. It returns the snapshot's size in bytes
	// beyond its image, or 0 when it cannot tell.
	Snapshot(ctx context.Context, id, sid string) (int64, error)
	// DeleteSnapshot frees snapshot sid: ErrNotFound if there is none,
	// ErrConflict while a sandbox made from it still needs it.
	DeleteSnapshot(ctx context.Context, sid string) error
}

// Sweeper is implemented by providers that make objects beside their
// sandboxes (a network policy, a network) which can outlive a sandbox
// whose gateway died mid-create or mid-delete. The service calls Sweep
// once at start, after reconciling; it removes only objects of this
// provider instance whose sandbox is gone, and is safe while other
// replicas create.
type Sweeper interface {
	Sweep(ctx context.Context) error
}
