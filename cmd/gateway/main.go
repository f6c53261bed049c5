// Command gateway is sandgate: an HTTP gateway for code-execution
// sandboxes. This file only wires: flags and env -> config, provider,
// service, handler, and a graceful shutdown.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/sandgate/sandgate/internal/dockerimages"
	"github.com/sandgate/sandgate/internal/e2b"
	"github.com/sandgate/sandgate/internal/handlers"
	"github.com/sandgate/sandgate/internal/metrics"
	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/providers/docker"
	"github.com/sandgate/sandgate/internal/providers/kubernetes"
	"github.com/sandgate/sandgate/internal/providers/local"
	"github.com/sandgate/sandgate/internal/pty"
	"github.com/sandgate/sandgate/internal/sandbox"
)

func main() {
	// gateway shell / gateway exec: clients of a gateway (clientcmd.go).
	if code, ok := runClientCommand(os.Args[1:]); ok {
		os.Exit(code)
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// tryLine is the first request make run suggests: one that works on this
// gateway (an image where the provider needs one, the key header where
// keys are required; the key itself is never printed).
func tryLine(url, provider string, keys bool) string {
	body, auth, note := "{}", "", ""
	if provider != "local" {
		body = `{"image": "IMAGE"}`
		note = "  (IMAGE: an image the " + provider + " provider can run"
		if provider == "docker" {
			note += ", e.g. one `docker images` lists"
		}
		note += ")\n"
	}
	if keys {
		auth = ` -H "Authorization: Bearer $SANDGATE_API_KEY"`
		note += "  (SANDGATE_API_KEY: one of the gateway's --api-key keys)\n"
	}
	return fmt.Sprintf("try:\n  curl -s -X POST %s/v1/sandboxes -H 'Content-Type: application/json'%s -d '%s'\n%s", url, auth, body, note)
}

// run parses args and serves until ctx ends or SIGTERM/SIGINT arrives.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			args = args[1:]
		case "healthcheck":
			return healthcheck(args[1:], stderr)
		}
	}
	cfg, err := parseConfig(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr)
	// Once serving, signals are caught until run returns, cleanup included
	// (this defer runs last): the first starts the shutdown, a second cuts
	// its drain short; neither kills the process halfway through closing
	// its state. During start-up they still end the process at once.
	sigs := make(chan os.Signal, 2)
	defer signal.Stop(sigs)
	if cfg.MemoryLimit > 0 {
		// Process-wide: put back what was there when run returns.
		defer debug.SetMemoryLimit(debug.SetMemoryLimit(int64(cfg.MemoryLimit)))
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	loopback := isLoopback(ln.Addr())
	if len(cfg.APIKeys) == 0 && !loopback && !cfg.InsecureNoAuth {
		return fmt.Errorf("refusing to listen on %s without an API key: set --api-key (or SANDGATE_API_KEYS), or --insecure-no-auth", ln.Addr())
	}
	publicURL := cfg.PublicURL
	if publicURL == "" {
		publicURL = "http://" + ln.Addr().String()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	ceilings, maxPids, err := cfg.Ceilings.resolve(cfg.StateDir, cfg.PidsMax)
	if err != nil {
		return err
	}
	log.Info("ceilings", "memory_mib", ceilings.MemoryMiB, "cpu", ceilings.CPU, "disk_gib", ceilings.DiskGiB, "pids", maxPids, "ttl", ceilings.TTL,
		"env_bytes", ceilings.EnvBytes, "metadata_bytes", ceilings.MetadataBytes, "files_bytes", ceilings.FilesBytes, "files", ceilings.Files)

	reg := prometheus.NewRegistry()
	p, err := newProvider(cfg, maxPids, log, reg)
	if err != nil {
		return err
	}
	defer p.Close()
	met := metrics.New(reg)
	var store sandbox.Store
	if k, ok := p.(*kubernetes.Kubernetes); ok {
		store = k.Store() // records and leases in the cluster: replicas share them
	}
	admission, err := admissionOptions(cfg)
	if err != nil {
		return err
	}
	svc, err := sandbox.New(ctx, sandbox.Options{
		Budget:             admission.Budget,
		Quotas:             admission.Quotas,
		DefaultMemoryMiB:   admission.DefaultMemoryMiB,
		DefaultDiskGiB:     admission.DefaultDiskGiB,
		Pools:              cfg.Pools,
		Store:              store,
		Provider:           p,
		StateDir:           cfg.StateDir,
		LeaseSecret:        cfg.LeaseSecret,
		APIKeys:            cfg.APIKeys,
		AllowAnonymous:     len(cfg.APIKeys) == 0,
		MaxSandboxes:       cfg.MaxSandboxes,
		QueueTimeout:       cfg.QueueTimeout,
		DefaultTTL:         cfg.DefaultTTL,
		MaxExecOutput:      cfg.MaxExecOutput,
		MaxExecOutputTotal: cfg.MaxExecOutputTotal,
		MaxExecs:           cfg.MaxExecs,
		MaxExecsPerSandbox: cfg.MaxExecsPerSandbox,
		CommandRetention:   cfg.CommandRetention,
		Ceilings:           ceilings,
		VolumeRoots:        cfg.VolumeRoots,
		CapAddAllow:        cfg.CapAddAllow,
		Logger:             log,
		Metrics:            met,
	})
	if err != nil {
		return err
	}
	defer svc.Close()
	terms := pty.NewManager(svc, pty.Options{
		RingBytes: cfg.PTYRingBytes, AllowedOrigins: cfg.AllowedOrigins,
		MaxSessions: cfg.MaxPTYSessions, MaxPerSandbox: cfg.MaxPTYPerSandbox,
		Logger: log, Metrics: met,
	})
	// Before svc.Close: closing ends the terminal sessions and waits for
	// their goroutines and WebSockets.
	defer terms.Close()
	h, err := handlers.New(handlers.Options{
		Service: svc, PublicURL: publicURL, PTY: terms, Logger: log, Metrics: met, Gatherer: reg,
		MaxJSONBody: cfg.MaxJSONBody, MaxUploadBody: cfg.MaxBody, MaxBodyInflight: cfg.MaxBodyInflight,
		BodyTimeout: cfg.BodyTimeout, ReplyTimeout: cfg.ReplyTimeout, Heartbeat: cfg.Heartbeat,
	})
	if err != nil {
		return err
	}

	// No server-wide read or write timeout: streamed files and long execs
	// take as long as they take. The handler bounds what is not streamed
	// (a JSON body's arrival, a reply's progress); the headers and an
	// idle connection are bounded here.
	if cfg.E2B {
		h = withE2B(h, e2b.New(e2b.Options{Service: svc, PTY: terms, Logger: log}))
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	// Shutdown does not wait for hijacked connections: the WebSockets are
	// told 1001 as it starts, and terms.Close below waits for them.
	srv.RegisterOnShutdown(terms.Shutdown)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	log.Info("sandgate listening", "url", publicURL, "provider", p.Name(), "state_dir", cfg.StateDir, "auth", authMode(cfg, loopback), "memory_limit", memoryLimit())
	fmt.Fprintf(stdout, "sandgate is listening on %s (provider %s)\n", publicURL, p.Name())
	fmt.Fprint(stdout, tryLine(publicURL, p.Name(), len(cfg.APIKeys) > 0))

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	case <-sigs:
	}
	log.Info("shutting down: draining in-flight requests; sandboxes keep running", "grace", cfg.ShutdownGrace)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- srv.Shutdown(sctx) }()
	select {
	case err = <-drained:
		if errors.Is(err, context.DeadlineExceeded) {
			srv.Close()
			err = fmt.Errorf("in-flight requests outlasted --shutdown-grace %v: closed", cfg.ShutdownGrace)
		}
	case <-sigs:
		log.Info("second signal: closing the remaining connections now")
		srv.Close()
		err = <-drained // it returns once the closed connections are gone
	}
	<-served
	terms.Close()
	return err
}

// memoryLimit describes the Go runtime's soft memory limit.
func memoryLimit() string {
	if n := debug.SetMemoryLimit(-1); n != math.MaxInt64 { // -1 only reads it
		return strconv.FormatInt(n, 10)
	}
	return "none"
}

func authMode(cfg config, loopback bool) string {
	switch {
	case len(cfg.APIKeys) > 0:
		return "api-key"
	case loopback:
		return "anonymous (loopback only)"
	default:
		return "none (--insecure-no-auth)"
	}
}

// newProvider makes the provider cfg names; maxPids is the ceiling on a
// create's process limit (docker's pids_limit).
func newProvider(cfg config, maxPids int64, log *slog.Logger, reg prometheus.Registerer) (providers.Provider, error) {
	switch cfg.Provider {
	case "local":
		images := cfg.LocalImages
		if images == "" {
			images = filepath.Join(cfg.StateDir, "images")
		}
		// The agent binary starts each sandbox's setup and init faster
		// than the gateway's own; without one beside it, the gateway's.
		initBin := cfg.AgentBinary
		if initBin == "" {
			if self, err := os.Executable(); err == nil {
				p := filepath.Join(filepath.Dir(self), "sandgate-agent")
				if _, err := os.Stat(p); err == nil {
					initBin = p
				}
			}
		}
		var daemon *dockerimages.Daemon
		if cfg.LocalDockerImages {
			var err error
			if daemon, err = dockerimages.Open(""); err != nil {
				log.Warn("the docker daemon's images are out of reach", "err", err)
			}
		}
		l, err := local.New(local.Options{
			StateDir:         filepath.Join(cfg.StateDir, "local"),
			InitBinary:       initBin,
			Isolation:        cfg.LocalIsolation,
			Logger:           log.With("provider", "local"),
			IDBase:           uint32(cfg.IDBase),
			DefaultMemoryMiB: noneIfZero(cfg.DefaultMemoryMiB),
			DefaultCPU:       cfg.DefaultCPU,
			DefaultDiskGiB:   noneIfZero(cfg.DefaultDiskGiB),
			PidsMax:          cfg.PidsMax,
			ShmMiB:           cfg.ShmMiB,
			Images:           images,
			DockerImages:     daemon,
			// The lease key and the store: never inside a sandbox.
			Private: []string{cfg.StateDir},
			Egress:  cfg.Egress.options(log, reg),
		})
		if errors.Is(err, local.ErrNoNamespaces) {
			err = fmt.Errorf("%w\nRun the gateway as root (the local provider's isolation needs it), or give --local-isolation none (SANDGATE_LOCAL_ISOLATION=none) to run sandboxes as plain host processes of your user, with no isolation: for one trusted user only", err)
		}
		if err != nil {
			return nil, err
		}
		return l, nil
	case "docker":
		id := cfg.InstanceID
		if id == "" {
			var err error
			if id, err = instanceID(cfg.StateDir); err != nil {
				return nil, err
			}
		}
		bin := cfg.AgentBinary
		if bin == "" {
			self, err := os.Executable()
			if err != nil {
				return nil, err
			}
			bin = filepath.Join(filepath.Dir(self), "sandgate-agent")
		}
		return docker.New(docker.Options{
			Host:             cfg.DockerHost,
			InstanceID:       id,
			AgentBinary:      bin,
			VolumeDir:        filepath.Join(cfg.StateDir, "docker-volumes"),
			Logger:           log.With("provider", "docker"),
			DefaultMemoryMiB: noneIfZero(cfg.DefaultMemoryMiB),
			DefaultCPU:       noneIfZero(cfg.DefaultCPU),
			PidsLimit:        cfg.PidsMax,
			MaxPidsLimit:     maxPids,
			// Sandbox networks are isolated by the provider's own firewall
			// rules; without them, ports are refused unless the operator
			// says otherwise.
			UnisolatedNetworks: cfg.DockerUnisolated,
			Egress:             cfg.Egress.options(log, reg),
		})
	case "kubernetes":
		// client-go logs through klog: into the gateway's log, at debug
		// (what it reports, e.g. a closed exec stream, is handled here).
		klog.SetSlogLogger(slog.New(debugOnly{log.With("component", "client-go").Handler()}))
		id := cfg.InstanceID
		if id == "" {
			var err error
			if id, err = instanceID(cfg.StateDir); err != nil {
				return nil, err
			}
		}
		return kubernetes.New(kubernetes.Options{
			Kubeconfig:       cfg.Kubeconfig,
			Namespace:        cfg.K8sNamespace,
			InstanceID:       id,
			AgentImage:       cfg.K8sAgentImage,
			RunAsNonRoot:     cfg.K8sRunAsNonRoot,
			NoNetworkPolicy:  !cfg.K8sNetworkPolicy,
			EgressSidecar:    cfg.K8sEgressSidecar,
			EgressResolve:    cfg.Egress.Resolve,
			Logger:           log.With("provider", "kubernetes"),
			DefaultMemoryMiB: noneIfZero(cfg.DefaultMemoryMiB),
			DefaultCPU:       noneIfZero(cfg.DefaultCPU),
		})
	default:
		return nil, fmt.Errorf("unknown provider %q (have: local, docker, kubernetes)", cfg.Provider)
	}
}

// noneIfZero turns the flags' "0 = no limit" into the providers' "0 =
// their default, negative = no limit".
func noneIfZero[T int64 | float64](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// instanceID is this gateway's identity towards a shared backend (the
// sandgate.instance label): random, made once and kept in the state dir,
// so a restarted gateway adopts its own sandboxes and no other's.
func instanceID(stateDir string) (string, error) {
	path := filepath.Join(stateDir, "instance.id")
	if b, err := os.ReadFile(path); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write instance id: %w", err)
	}
	return id, nil
}

// debugOnly logs every record at debug level.
type debugOnly struct{ h slog.Handler }

func (d debugOnly) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugOnly) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugOnly) WithAttrs(as []slog.Attr) slog.Handler { return debugOnly{d.h.WithAttrs(as)} }
func (d debugOnly) WithGroup(g string) slog.Handler       { return debugOnly{d.h.WithGroup(g)} }

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

func newLogger(level, format string, w io.Writer) *slog.Logger {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lv = slog.LevelInfo
	}
	o := &slog.HandlerOptions{Level: lv}
	if strings.EqualFold(format, "json") {
		return slog.New(slog.NewJSONHandler(w, o))
	}
	return slog.New(slog.NewTextHandler(w, o))
}

// withE2B serves the E2B face (package e2b) under e2b.DefaultPrefix and
// the rest with h. One listener serves both: the E2B SDKs take whole
// base URLs (E2B_API_URL, E2B_SANDBOX_URL), path included, so a prefix is
// all they need, and the face shares the gateway's TLS, port and
// shutdown. The paths are matched by hand, not by an http.ServeMux, which
// would clean (and redirect) the paths h serves as they are (the proxy's).
func withE2B(h, face http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, e2b.DefaultPrefix+"/") {
			face.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
