// Package kubernetes is the Kubernetes provider: one pod per sandbox,
// made and removed through the API server (client-go), its data plane
// through the in-sandbox agent (package agent).
//
// A sandbox's pod is named by the sandbox id and labelled
// sandgate.sandbox=<id> and sandgate.instance=<instance id>; List and
// reconciliation look only at this instance's pods. A sidecar of the
// agent's image (Options.AgentImage: the static binary, nothing else;
// an init container with restartPolicy Always) copies the agent into an
// emptyDir that the sandbox's container mounts read-only at /.sandgate,
// so the user's image is used as it is.
// The gateway reaches the agent through one long-lived exec of its bridge
// (the pod's exec subresource, WebSocket protocol, SPDY as the fallback):
// each command, file and terminal session is a stream on that connection,
// not an API-server exec of its own.
//
// Pods are hardened: no service-account token, no privilege escalation,
// the runtime's default seccomp profile, a few capabilities dropped, no
// service links, a one-second grace. The pod's processes share one pid
// namespace whose PID 1 (the pause process) reaps orphans. Each pod has a
// NetworkPolicy of its own allowing no traffic in or out (netpol.go),
// which an egress policy's CIDR rules and a group's members open
// (egress.go).
package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/providers"
)

// Labels every sandbox pod carries.
const (
	LabelSandbox  = "sandgate.sandbox"
	LabelInstance = "sandgate.instance"
)

// The container names of a sandbox's pod.
const (
	containerSandbox = "sandbox"
	containerAgent   = "sandgate-agent"
)

// Defaults for Options.
const (
	DefaultNamespace      = "default"
	DefaultMemoryLimitMiB = 2048
	DefaultCPULimit       = 2.0
	DefaultPingTimeout    = 3 * time.Second
)

// DefaultCapDrop are the capabilities dropped from the runtime's default
// set: raw sockets, device nodes, audit writes and file capabilities (as
// the docker provider).
var DefaultCapDrop = []corev1.Capability{"NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP"}

// Options configure New.
type Options struct {
	// Kubeconfig is the kubeconfig file. "" = $KUBECONFIG, else the
	// in-cluster configuration (a gateway running as a pod).
	Kubeconfig string
	// RestConfig, when set, is used instead of Kubeconfig.
	RestConfig *rest.Config
	// Namespace holds the sandbox pods. "" = DefaultNamespace.
	Namespace string
	// InstanceID names the gateway instance that owns the sandboxes (the
	// sandgate.instance label). "" = "default".
	InstanceID string
	// AgentImage is an image holding the static agent binary at
	// /sandgate-agent (make agent-image builds one). Required.
	AgentImage string
	// DefaultMemoryMiB is a sandbox's memory limit when the create gives
	// none. 0 = DefaultMemoryLimitMiB; <0 = none.
	DefaultMemoryMiB int64
	// DefaultCPU is a sandbox's CPU limit when the create gives none.
	// 0 = DefaultCPULimit; <0 = none.
	DefaultCPU float64
	// RunAsNonRoot runs every sandbox as uid and gid 65534 instead of the
	// image's user, with a workdir of its own (an emptyDir).
	RunAsNonRoot bool
	// NoNetworkPolicy makes no NetworkPolicy for the sandbox pods (see
	// netpol.go), for a cluster whose operator isolates them otherwise.
	// By default every pod gets one allowing no ingress and no egress.
	NoNetworkPolicy bool
	// EgressSidecar gives every sandbox pod its own egress point
	// (sidecar.go): egress policies, domain rules included, and groups
	// are enforced whatever the CNI. Its container runs as root with
	// NET_ADMIN (AgentImage must hold /sandgate-egress).
	EgressSidecar bool
	// EgressResolve are static answers of the pods' egress points' DNS,
	// given before the cluster's (tests, air-gapped sites).
	EgressResolve map[string][]netip.Addr
	// StorageClass is the storage class of volumes' claims (volumes.go);
	// "" = the cluster's default.
	StorageClass string
	// PingTimeout bounds Ping. 0 = DefaultPingTimeout.
	PingTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Kubernetes is the Kubernetes provider. It is safe for concurrent use.
type Kubernetes struct {
	agentclient.Via // exec, files and processes, through the sandbox's agent
	cs              kubernetes.Interface
	hc              *http.Client // cs's
	cfg             *rest.Config
	links           agentclient.Links
	opts            Options
	ns              string
	log             *slog.Logger

	mu      sync.Mutex
	reasons map[string]string // why a sandbox is in error, as its pod said

	fw forwards // the declared ports' port-forwards (ports.go)
}

var (
	_ providers.Provider      = (*Kubernetes)(nil)
	_ providers.StateReasoner = (*Kubernetes)(nil)
	_ providers.FileLister    = (*Kubernetes)(nil)
	_ providers.Sweeper       = (*Kubernetes)(nil)
	_ agentclient.Provider    = (*Kubernetes)(nil)
)

// New connects to the cluster (it does not call it yet: Ping does).
func New(opts Options) (*Kubernetes, error) {
	if opts.AgentImage == "" {
		return nil, errors.New("kubernetes: an agent image is required (--k8s-agent-image; make agent-image builds one)")
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.InstanceID == "" {
		opts.InstanceID = "default"
	}
	if opts.DefaultMemoryMiB == 0 {
		opts.DefaultMemoryMiB = DefaultMemoryLimitMiB
	}
	if opts.DefaultCPU == 0 {
		opts.DefaultCPU = DefaultCPULimit
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = DefaultPingTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	cfg := opts.RestConfig
	if cfg == nil {
		var err error
		if cfg, err = restConfig(opts.Kubeconfig); err != nil {
			return nil, fmt.Errorf("kubernetes: %w", err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	// The gateway's own calls are many and small; the defaults (5 QPS)
	// would queue a batch of creates.
	cfg.QPS, cfg.Burst = 200, 400
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	k := &Kubernetes{cs: cs, hc: hc, cfg: cfg, opts: opts, ns: opts.Namespace, log: opts.Logger, reasons: map[string]string{}}
	k.links.Open, k.links.Running = k.openAgent, k.running
	k.Via = agentclient.Via{Connect: k.Agent, Links: &k.links}
	return k, nil
}

// restConfig loads path, else $KUBECONFIG, else the in-cluster config.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	if path != "" || len(rules.Precedence) > 0 && anyExists(rules.Precedence) {
		return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no kubeconfig (--kubeconfig or KUBECONFIG) and not in a cluster: %w", err)
	}
	return cfg, nil
}

// Name returns "kubernetes".
func (k *Kubernetes) Name() string { return "kubernetes" }

// Close closes the connections to the agents and the idle ones to the
// API server; sandboxes keep running.
func (k *Kubernetes) Close() error {
	k.stopForwards("")
	k.links.Close()
	utilnet.CloseIdleConnectionsFor(k.hc.Transport)
	return nil
}

// Ping reports whether the API server answers within Options.PingTimeout.
func (k *Kubernetes) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.opts.PingTimeout)
	defer cancel()
	if err := k.cs.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		return providers.Wrap(providers.ErrUnavailable, err, "kubernetes API server is not answering")
	}
	return nil
}

// Agent returns the connection to sandbox id's agent (see agentclient.Links).
func (k *Kubernetes) Agent(ctx context.Context, id string) (*agentclient.Client, error) {
	return k.links.Get(ctx, id)
}

// pod returns sandbox id's pod: ErrNotFound when there is none (or it is
// not a sandbox's).
func (k *Kubernetes) pod(ctx context.Context, id string) (*corev1.Pod, error) {
	pod, err := k.cs.CoreV1().Pods(k.ns).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		return nil, k.kind(err, "sandbox %s", id)
	}
	if pod.Labels[LabelSandbox] != id {
		return nil, providers.Errorf(providers.ErrNotFound, "sandbox %s not found", id)
	}
	return pod, nil
}

// Status maps the pod to the sandbox states: pending is starting; running
// is running unless the sandbox's container ended or its agent is gone
// (error); succeeded is stopped; failed is error (OOMKilled, Evicted,
// ... in StateReason); a pod being deleted is stopped. A missing pod is
// ErrNotFound.
func (k *Kubernetes) Status(ctx context.Context, id string) (providers.State, error) {
	pod, err := k.pod(ctx, id)
	if err != nil {
		return providers.StateUnknown, err
	}
	st, why := stateOf(pod)
	if st == providers.StateRunning {
		if _, err := k.Agent(ctx, id); err != nil && k.links.Broken(id) != "" {
			st, why = providers.StateError, k.links.Broken(id)
		}
	}
	k.mu.Lock()
	if why != "" {
		k.reasons[id] = why
	} else {
		delete(k.reasons, id)
	}
	k.mu.Unlock()
	return st, nil
}

// StateReason says why sandbox id is in error ("" when it is not).
func (k *Kubernetes) StateReason(id string) string {
	if why := k.links.Broken(id); why != "" {
		return why
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reasons[id]
}

// stateOf is a pod's sandbox state, and why when it is error.
func stateOf(pod *corev1.Pod) (providers.State, string) {
	if pod.DeletionTimestamp != nil {
		return providers.StateStopped, ""
	}
	switch pod.Status.Phase {
	case corev1.PodPending:
		return providers.StateStarting, ""
	case corev1.PodRunning:
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name != containerSandbox {
				continue
			}
			if t := cs.State.Terminated; t != nil {
				if t.ExitCode == 0 && t.Reason != "OOMKilled" {
					return providers.StateStopped, ""
				}
				return providers.StateError, terminatedReason(t)
			}
			if w := cs.State.Waiting; w != nil {
				return providers.StateStarting, ""
			}
		}
		return providers.StateRunning, ""
	case corev1.PodSucceeded:
		return providers.StateStopped, ""
	case corev1.PodFailed:
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.State.Terminated; cs.Name == containerSandbox && t != nil && (t.Reason == "OOMKilled" || t.ExitCode != 0) {
				return providers.StateError, terminatedReason(t)
			}
		}
		why := pod.Status.Reason // Evicted, DeadlineExceeded, ...
		if pod.Status.Message != "" {
			why += ": " + pod.Status.Message
		}
		if why == "" {
			why = "the pod failed"
		}
		return providers.StateError, why
	}
	return providers.StateUnknown, ""
}

func terminatedReason(t *corev1.ContainerStateTerminated) string {
	why := t.Reason
	if why == "" {
		why = "exited"
	}
	why += fmt.Sprintf(" (exit code %d)", t.ExitCode)
	if t.Reason == "OOMKilled" {
		why += ": the sandbox went over its memory limit"
	}
	if t.Message != "" {
		why += ": " + t.Message
	}
	return why
}

// running is agentclient.Links.Running: nil when the pod runs, else its state
// as an error.
func (k *Kubernetes) running(ctx context.Context, id string) error {
	pod, err := k.pod(ctx, id)
	if err != nil {
		return err
	}
	if st, why := stateOf(pod); st != providers.StateRunning {
		if why != "" {
			return providers.Errorf(providers.ErrConflict, "sandbox %s is %s: %s", id, st, why)
		}
		return providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, st)
	}
	return nil
}

// List reports this instance's sandboxes.
func (k *Kubernetes) List(ctx context.Context) ([]providers.Owned, error) {
	pods, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelInstance + "=" + k.opts.InstanceID + "," + LabelSandbox})
	if err != nil {
		return nil, k.kind(err, "list sandboxes")
	}
	out := make([]providers.Owned, 0, len(pods.Items))
	for i := range pods.Items {
		p := &pods.Items[i]
		st, _ := stateOf(p)
		out = append(out, providers.Owned{ID: p.Labels[LabelSandbox], State: st})
	}
	return out, nil
}

// Delete removes sandbox id's pod at once (grace period 0: its processes
// are killed, not asked to stop), waits until the API server no longer
// has it, then removes its NetworkPolicy (after the pod: never a running
// pod without one).
func (k *Kubernetes) Delete(ctx context.Context, id string) error {
	pod, err := k.pod(ctx, id)
	if err != nil {
		return err
	}
	k.links.Drop(id)
	k.stopForwards(id)
	k.mu.Lock()
	delete(k.reasons, id)
	k.mu.Unlock()
	if err := k.remove(ctx, id); err != nil {
		return err
	}
	if g := pod.Labels[LabelGroup]; g != "" && k.opts.EgressSidecar {
		// The others' points forget its address (another pod may get it).
		if err := k.refreshPeers(ctx, g, ""); err != nil {
			k.log.Warn("hand a group its peers", "sandbox", id, "err", err)
		}
	}
	return nil
}

// remove deletes sandbox id's pod and waits for it to be gone, then
// deletes its NetworkPolicy. Either may be missing already.
func (k *Kubernetes) remove(ctx context.Context, id string) error {
	if err := k.deletePod(ctx, id); err != nil {
		return err
	}
	if k.opts.NoNetworkPolicy {
		return nil
	}
	return k.deletePolicy(ctx, id)
}

// deletePod deletes pod id with no grace and waits for it to be gone.
func (k *Kubernetes) deletePod(ctx context.Context, id string) error {
	zero := int64(0)
	err := k.cs.CoreV1().Pods(k.ns).Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return k.kind(err, "delete sandbox %s", id)
	}
	delay := 5 * time.Millisecond
	for {
		_, err := k.cs.CoreV1().Pods(k.ns).Get(ctx, id, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return k.kind(err, "delete sandbox %s", id)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("delete sandbox %s: %w", id, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// kind maps an API error to the provider error kinds.
func (k *Kubernetes) kind(err error, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	switch {
	case apierrors.IsNotFound(err):
		return providers.Wrap(providers.ErrNotFound, err, msg+": not found")
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return providers.Wrap(providers.ErrConflict, err, msg)
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsForbidden(err):
		return providers.Wrap(providers.ErrInvalid, err, msg+": "+apiMessage(err))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", msg, err)
	}
	return providers.Wrap(providers.ErrUnavailable, err, msg+": the API server")
}

func apiMessage(err error) string {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return strings.TrimSpace(s.Status().Message)
	}
	return err.Error()
}

func anyExists(paths []string) bool {
	for _, p := range paths {
		if fileExists(p) {
			return true
		}
	}
	return false
}
