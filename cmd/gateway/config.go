package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/handlers"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/sandbox"
)

// config is the gateway's configuration. Every flag has an environment
// twin SANDGATE_<FLAG> (upper case, dashes as underscores); a flag given
// on the command line wins over its twin.
type config struct {
	Listen             string
	PublicURL          string
	Provider           string
	StateDir           string
	APIKeys            []string
	LeaseSecret        string
	InsecureNoAuth     bool
	E2B                bool // serve the E2B face under /e2b
	MaxSandboxes       int
	QueueTimeout       time.Duration
	Overcommit         float64 // memory admission budget: host memory × this (0: none)
	DiskOvercommit     float64 // disk admission budget: state dir filesystem × this (0: none)
	QuotaSandboxes     int     // per API key; 0 = unlimited, as every quota
	QuotaMemoryMiB     int64
	QuotaDiskGiB       float64
	QuotaSnapshots     int
	QuotaSnapshotBytes byteSize
	DefaultTTL         time.Duration
	MaxExecOutput      int
	MaxExecOutputTotal int64
	MemoryLimit        byteSize // 0: leave GOMEMLIMIT as the environment set it
	MaxExecs           int
	MaxExecsPerSandbox int
	MaxPTYSessions     int
	MaxPTYPerSandbox   int
	MaxBody            int64
	MaxJSONBody        int64
	MaxBodyInflight    int64
	BodyTimeout        time.Duration
	ReplyTimeout       time.Duration
	Heartbeat          time.Duration
	CommandRetention   time.Duration
	IdleTimeout        time.Duration
	ShutdownGrace      time.Duration
	LocalIsolation     string
	DefaultMemoryMiB   int64
	DefaultCPU         float64
	DefaultDiskGiB     float64
	PidsMax            int64
	Ceilings           ceilingFlags // see ceilings.go
	Egress             egressFlags  // see egress.go
	IDBase             uint
	ShmMiB             int64
	LocalImages        string
	LocalDockerImages  bool
	AgentBinary        string
	DockerHost         string
	DockerUnisolated   bool
	Kubeconfig         string
	InstanceID         string
	K8sNamespace       string
	K8sAgentImage      string
	K8sRunAsNonRoot    bool
	K8sNetworkPolicy   bool
	K8sEgressSidecar   bool
	Pools              []sandbox.PoolSpec
	PTYRingBytes       int
	AllowedOrigins     []string
	VolumeRoots        []string
	CapAddAllow        []string
	LogLevel           string
	LogFormat          string
}

// envName is the environment twin of a flag.
func envName(flagName string) string {
	return "SANDGATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/sandgate"
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".local", "state", "sandgate")
	}
	return filepath.Join(os.TempDir(), "sandgate")
}

// newFlagSet defines every flag, bound to c (and keys, the raw
// --api-key list). It is the single source of the configuration table.
func newFlagSet(c *config, keys *string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, commandsUsage)
		fmt.Fprint(stderr, "\nFlags of `gateway [serve]` (each also from its SANDGATE_* environment variable):\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&c.PublicURL, "public-url", "", "external base URL of the gateway (default http://<listen address>)")
	fs.StringVar(&c.Provider, "provider", "local", "sandbox backend: local, docker or kubernetes")
	fs.StringVar(&c.StateDir, "state-dir", defaultStateDir(), "directory for the state store, lease secret and local sandboxes")
	fs.StringVar(keys, "api-key", "", "comma-separated API keys allowed to create and list sandboxes")
	fs.StringVar(&c.LeaseSecret, "lease-secret", "", "HMAC secret for lease tokens (default: random, persisted in the state dir)")
	fs.BoolVar(&c.InsecureNoAuth, "insecure-no-auth", false, "allow anonymous creates on a non-loopback address")
	fs.BoolVar(&c.E2B, "e2b", false, "also speak E2B's API, so the E2B SDKs work unchanged: E2B_API_URL=<public url>/e2b/api, E2B_SANDBOX_URL=<public url>/e2b/sandbox, E2B_API_KEY=<an API key>")
	fs.IntVar(&c.MaxSandboxes, "max-sandboxes", 64, "live sandboxes at most; further creates wait in a FIFO queue")
	fs.DurationVar(&c.QueueTimeout, "queue-timeout", 600*time.Second, "how long a create waits for capacity before 503")
	fs.Float64Var(&c.Overcommit, "overcommit", 1.5, "memory admission budget: the memory live sandboxes commit (their memory_mib, else --default-memory-mib) stays within host memory × this; a create beyond it waits in the queue (0 = no budget; local and docker, whose daemon is taken to be on this host; none on kubernetes)")
	fs.Float64Var(&c.DiskOvercommit, "disk-overcommit", 1, "disk admission budget: the disk live sandboxes commit (their disk_gib, else local's --default-disk-gib) stays within the size of the state dir's filesystem × this (0 = no budget; local and docker; none on kubernetes)")
	fs.IntVar(&c.QuotaSandboxes, "quota-sandboxes", 0, "live sandboxes (with queued creates) per API key; beyond it 429 quota_exceeded (0 = unlimited)")
	fs.Int64Var(&c.QuotaMemoryMiB, "quota-memory-mib", 0, "memory committed per API key, in MiB (0 = unlimited)")
	fs.Float64Var(&c.QuotaDiskGiB, "quota-disk-gib", 0, "disk committed per API key, in GiB (0 = unlimited)")
	fs.IntVar(&c.QuotaSnapshots, "quota-snapshots", 0, "snapshots kept per API key, also of deleted sandboxes (0 = unlimited)")
	fs.Var(&c.QuotaSnapshotBytes, "quota-snapshot-bytes", "bytes of snapshots kept per API key, with an optional unit (50GiB), where the provider can tell their size (local, docker) (default: unlimited)")
	fs.DurationVar(&c.DefaultTTL, "default-ttl", 1800*time.Second, "sandbox lifetime when a create gives no ttl_s (0 = none)")
	fs.IntVar(&c.MaxExecOutput, "max-exec-output", providers.DefaultMaxOutput, "bytes of stdout and of stderr kept per exec")
	fs.Int64Var(&c.MaxExecOutputTotal, "max-exec-output-total", 256<<20, "bytes of exec output held at once by the execs in flight of one API key (the sandbox creator's; anonymous is one key), all keys together at most 4 times this; an exec that finds less than twice --max-exec-output left keeps less (at least 64 KiB per stream) and is truncated")
	fs.Var(&c.MemoryLimit, "memory-limit", "soft limit on the gateway's memory, in bytes or with a unit (512MiB, 1GiB), as GOMEMLIMIT (default: GOMEMLIMIT, else none)")
	fs.IntVar(&c.MaxExecs, "max-execs", 1024, "concurrent execs in all sandboxes; beyond it 429")
	fs.IntVar(&c.MaxExecsPerSandbox, "max-execs-per-sandbox", 256, "concurrent execs in one sandbox; beyond it 429")
	fs.IntVar(&c.MaxPTYSessions, "max-pty-sessions", 4096, "terminal sessions in all sandboxes; beyond it 503")
	fs.IntVar(&c.MaxPTYPerSandbox, "max-pty-per-sandbox", 256, "terminal sessions in one sandbox; beyond it 429")
	fs.Int64Var(&c.MaxBody, "max-body", handlers.DefaultMaxUploadBody, "largest body of the base64 upload, and file of the base64 download, in bytes (the streaming file routes have no cap)")
	fs.Int64Var(&c.MaxJSONBody, "max-json-body", handlers.DefaultMaxJSONBody, "largest JSON request body in bytes but the base64 upload's (create, exec, ...); beyond it 413")
	fs.Int64Var(&c.MaxBodyInflight, "max-body-inflight", handlers.DefaultMaxBodyInflight, "bytes of JSON request bodies buffered at once, a quarter of it for the requests of one API key; beyond it 503")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", handlers.DefaultBodyTimeout, "how long a client may take to send a JSON request body (the base64 upload's included); beyond it 408")
	fs.DurationVar(&c.ReplyTimeout, "reply-timeout", handlers.DefaultReplyTimeout, "an exec or base64 download reply the client takes nothing of for this long is cut (its connection closed, its output released)")
	fs.DurationVar(&c.Heartbeat, "heartbeat", handlers.DefaultHeartbeat, "how often a reply waiting for a command (exec, a command's wait or SSE output) writes whitespace or a keepalive while quiet, so proxies that cut idle connections leave it")
	fs.DurationVar(&c.CommandRetention, "command-retention", sandbox.DefaultCommandRetention, "how long a sandbox keeps a durable command's output and result after it ended")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", 120*time.Second, "how long a keep-alive connection may wait for its next request")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long SIGTERM waits for in-flight requests (a second signal closes them at once)")
	fs.StringVar(&c.LocalIsolation, "local-isolation", "namespaces", "local provider isolation: namespaces or none (plain host processes)")
	fs.Int64Var(&c.DefaultMemoryMiB, "default-memory-mib", 2048, "memory limit of a sandbox whose create sets none, in MiB (0 = none)")
	fs.Float64Var(&c.DefaultCPU, "default-cpu", 2, "CPU limit of a sandbox whose create sets none, in cores (0 = none)")
	fs.Float64Var(&c.DefaultDiskGiB, "default-disk-gib", 10, "local: disk limit of a sandbox whose create sets none, in GiB, a filesystem of its own (0 = none: writes land on the state dir's filesystem)")
	fs.Int64Var(&c.PidsMax, "pids-max", 0, "processes per sandbox (0 = the provider's default: local 1/16 of the host's pid_max or threads-max within 64..4096, all sandboxes together 1/2; docker 1024, at most --max-pids)")
	c.Ceilings.define(fs)
	c.Egress.define(fs)
	fs.UintVar(&c.IDBase, "id-base", 100000, "local: first host uid/gid of the sandboxes' id ranges (65,536 ids each; sandbox root is never host root)")
	fs.Int64Var(&c.ShmMiB, "shm-mib", 64, "local: size of each sandbox's /dev/shm, in MiB")
	fs.BoolVar(&c.LocalDockerImages, "local-docker-images", true, "local: an image the image directory lacks is taken from the local docker daemon's store (DOCKER_HOST, else its socket) when it has one: exported once, cached by id")
	fs.StringVar(&c.LocalImages, "local-images", "", "local: directory of images a create may name in `image` (root filesystem directories, docker save or OCI tarballs) (default <state-dir>/images)")
	fs.IntVar(&c.PTYRingBytes, "pty-ring-bytes", 1<<20, "output retained per terminal session for replay, in bytes")
	fs.Func("allowed-origins", "comma-separated browser origins allowed to attach to terminals besides the gateway's own: host patterns (*.example.com) or scheme://host", func(v string) error {
		c.AllowedOrigins = c.AllowedOrigins[:0] // the command line replaces the environment's list
		for _, o := range strings.Split(v, ",") {
			if o = strings.TrimSpace(o); o != "" {
				c.AllowedOrigins = append(c.AllowedOrigins, o)
			}
		}
		return nil
	})
	fs.Func("volume-root", "a host directory under which a create may mount a host_path volume (absolute; repeatable, or several separated by commas; default: none, host paths refused)", func(v string) error {
		for _, r := range strings.Split(v, ",") {
			if r = strings.TrimSpace(r); r == "" {
				continue
			}
			if !filepath.IsAbs(r) {
				return fmt.Errorf("%q is not an absolute path", r)
			}
			c.VolumeRoots = append(c.VolumeRoots, filepath.Clean(r))
		}
		return nil
	})
	fs.Func("cap-add-allow", "capabilities a create's cap_add may name, kept inside the sandbox's own namespaces (e.g. NET_ADMIN,SYS_PTRACE; CAP_ prefix accepted; repeatable, or several separated by commas; default: none, any cap_add refused)", func(v string) error {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name == "" {
				continue
			}
			n, ok := sandbox.NormalizeCap(name)
			if !ok {
				return fmt.Errorf("%q is not a Linux capability", name)
			}
			if !slices.Contains(c.CapAddAllow, n) {
				c.CapAddAllow = append(c.CapAddAllow, n)
			}
		}
		return nil
	})
	fs.Func("pool", "a warm pool, SPEC=N: N ready sandboxes for creates of SPEC, comma-separated image=, workdir=, cpu=, memory_mib=, disk_gib= (e.g. image=python:3.12-slim,memory_mib=1024=8); repeatable, or several separated by ;", func(v string) error {
		for _, one := range strings.Split(v, ";") {
			if one = strings.TrimSpace(one); one == "" {
				continue
			}
			p, err := sandbox.ParsePool(one)
			if err != nil {
				return err
			}
			c.Pools = append(c.Pools, p)
		}
		return nil
	})
	fs.Func("pool-file", "warm pools from a JSON file: [{\"image\": ..., \"workdir\": ..., \"resources\": {\"cpu\": ..., \"memory_mib\": ..., \"disk_gib\": ...}, \"count\": N}, ...]", func(path string) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var ps []struct {
			Image     string `json:"image"`
			Workdir   string `json:"workdir"`
			Resources struct {
				CPU       *float64 `json:"cpu"`
				MemoryMiB *int64   `json:"memory_mib"`
				DiskGiB   *float64 `json:"disk_gib"`
			} `json:"resources"`
			Count int `json:"count"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ps); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		for _, p := range ps {
			c.Pools = append(c.Pools, sandbox.PoolSpec{Image: p.Image, Workdir: p.Workdir, Count: p.Count,
				Resources: providers.Resources{CPU: p.Resources.CPU, MemoryMiB: p.Resources.MemoryMiB, DiskGiB: p.Resources.DiskGiB}})
		}
		return nil
	})
	fs.StringVar(&c.AgentBinary, "agent-binary", "", "docker: the static sandgate-agent binary every sandbox runs; local: the binary that starts each sandbox (the same one; without it the gateway's own, slower to start) (default: sandgate-agent beside the gateway's executable; make build puts it there)")
	fs.StringVar(&c.DockerHost, "docker-host", "", "docker provider: daemon address (default: DOCKER_HOST, else the local socket)")
	fs.BoolVar(&c.DockerUnisolated, "docker-unisolated-networks", false, "docker provider: where the gateway cannot install its firewall rules (not root, no iptables, a remote daemon), still create sandboxes with ports, whose networks then reach host listeners (default: such creates are refused)")
	fs.StringVar(&c.InstanceID, "instance-id", "", "docker, kubernetes: the gateway instance owning the sandboxes (their label); replicas serving the same sandboxes share it (default: random, persisted in the state dir)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubernetes provider: kubeconfig file (default: KUBECONFIG, else the in-cluster config)")
	fs.StringVar(&c.K8sNamespace, "k8s-namespace", "default", "kubernetes provider: namespace of the sandbox pods")
	fs.StringVar(&c.K8sAgentImage, "k8s-agent-image", "", "kubernetes provider: image holding the static agent at /sandgate-agent (make agent-image builds one); required")
	fs.BoolVar(&c.K8sRunAsNonRoot, "k8s-run-as-non-root", false, "kubernetes provider: run every sandbox as uid/gid 65534 (nobody), with a workdir of its own, instead of the image's user")
	fs.BoolVar(&c.K8sEgressSidecar, "k8s-egress-sidecar", false, "kubernetes provider: give every sandbox pod its own egress point (a sidecar running as root with NET_ADMIN, from the agent's image) that enforces egress policies, domain rules included, and groups whatever the CNI")
	fs.BoolVar(&c.K8sNetworkPolicy, "k8s-network-policy", true, "kubernetes provider: give every sandbox pod a NetworkPolicy allowing no ingress and no egress (enforced only by a CNI that implements NetworkPolicy), which egress policies' CIDR rules and groups open; false where the cluster's operator isolates the pods (egress policies other than none and groups are then 409, unless --k8s-egress-sidecar)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
	return fs
}

// secretFlags are the flags whose values are never printed (in usage
// texts and errors); their environment twins are read as values, never
// as flag defaults.
var secretFlags = map[string]bool{"api-key": true, "lease-secret": true}

// envOf is the environment twin of flag f.
func envOf(f *flag.Flag) string {
	if f.Name == "api-key" {
		return "SANDGATE_API_KEYS"
	}
	return envName(f.Name)
}

// configTable renders the flags as the README's markdown table.
func configTable() string {
	var c config
	var keys string
	fs := newFlagSet(&c, &keys, io.Discard)
	var b strings.Builder
	b.WriteString("| flag | environment | default | meaning |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *flag.Flag) {
		def := f.DefValue
		if f.Name == "state-dir" {
			def = "/var/lib/sandgate (root), else ~/.local/state/sandgate"
		}
		if def == "" {
			def = "(none)"
		}
		fmt.Fprintf(&b, "| `--%s` | `%s` | `%s` | %s |\n", f.Name, envOf(f), def, f.Usage)
	})
	return b.String()
}

// parseConfig reads flags from args, with defaults from the environment.
func parseConfig(args []string, lookup func(string) (string, bool), stderr io.Writer) (config, error) {
	var c config
	var keys string
	fs := newFlagSet(&c, &keys, stderr)

	var bad []string
	fs.VisitAll(func(f *flag.Flag) {
		name := envOf(f)
		if v, ok := lookup(name); ok && v != "" {
			if err := f.Value.Set(v); err != nil {
				shown := strconv.Quote(v)
				if secretFlags[f.Name] {
					shown = "(secret, not shown)"
				}
				bad = append(bad, fmt.Sprintf("%s=%s: %v", name, shown, err))
			}
		}
	})
	if len(bad) > 0 {
		return c, fmt.Errorf("bad environment: %s", strings.Join(bad, "; "))
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, k := range strings.Split(keys, ",") {
		if k = strings.TrimSpace(k); k != "" {
			c.APIKeys = append(c.APIKeys, k)
		}
	}
	if c.PTYRingBytes < 1 {
		return c, fmt.Errorf("--pty-ring-bytes must be at least 1")
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = -1 // the service's "no expiry"
	}
	if c.MaxSandboxes < 1 {
		return c, fmt.Errorf("--max-sandboxes must be at least 1")
	}
	if c.Overcommit < 0 || c.DiskOvercommit < 0 || c.QuotaSandboxes < 0 || c.QuotaMemoryMiB < 0 || c.QuotaDiskGiB < 0 || c.QuotaSnapshots < 0 {
		return c, fmt.Errorf("--overcommit, --disk-overcommit and the --quota-* flags must not be negative")
	}
	if c.MaxExecOutputTotal < 1 {
		return c, fmt.Errorf("--max-exec-output-total must be at least 1")
	}
	for name, v := range map[string]int64{"max-body": c.MaxBody, "max-json-body": c.MaxJSONBody, "max-body-inflight": c.MaxBodyInflight} {
		if v < 1 {
			return c, fmt.Errorf("--%s must be at least 1", name)
		}
	}
	for name, v := range map[string]time.Duration{"body-timeout": c.BodyTimeout, "reply-timeout": c.ReplyTimeout, "idle-timeout": c.IdleTimeout, "heartbeat": c.Heartbeat, "command-retention": c.CommandRetention} {
		if v <= 0 {
			return c, fmt.Errorf("--%s must be positive", name)
		}
	}
	return c, nil
}

// byteSize is a flag value in bytes, written as GOMEMLIMIT is: a number
// with an optional unit B, KiB, MiB, GiB or TiB. Zero means unset.
type byteSize int64

func (b byteSize) String() string {
	if b == 0 {
		return ""
	}
	return strconv.FormatInt(int64(b), 10)
}

func (b *byteSize) Set(v string) error {
	v = strings.TrimSpace(v)
	num, mult := v, int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}} {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > math.MaxInt64/mult {
		return fmt.Errorf("want a positive number of bytes, optionally with a unit B, KiB, MiB, GiB or TiB (like 1GiB)")
	}
	*b = byteSize(n * mult)
	return nil
}
