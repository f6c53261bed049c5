package kubernetes

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/sandgate/sandgate/internal/agentclient"
	"github.com/sandgate/sandgate/internal/egress"
	"github.com/sandgate/sandgate/internal/egress/point"
	"github.com/sandgate/sandgate/internal/providers"
)

// With Options.EgressSidecar every sandbox pod carries its own egress
// point (point.PodPoint), which enforces egress policies whatever the
// CNI, domain rules included: a native sidecar (an init container that
// stays), in the agent's sidecar's place, running sandgate-egress from
// the agent's image as root with NET_ADMIN alone. It installs the agent
// into the agent's volume and the pod's nftables rules (every TCP
// connection of the other containers to its proxy, DNS to its DNS server,
// the rest dropped, nothing in but loopback, replies and the group's
// peers), then serves. Its postStart hook returns once both are in place,
// and the kubelet starts the sandbox's container only after the hook: it
// never runs without them. (One sidecar, not two: each starts in a kubelet
// sync of its own, ~0.5 s apart.)
//
// The policy starts as none; SetEgress (and JoinGroup, for the peers)
// hand the point its state by an exec of "sandgate-egress set" in its
// container, which the point keeps in a volume of that container alone,
// so a restarted point starts from the last one. The sandbox's container
// never holds NET_ADMIN or NET_RAW with a policy (either could undo the
// rules or mark its sockets as the point's): a policy for a sandbox
// created with them is refused.

const (
	containerEgress = "sandgate-egress"
	egressBin       = "/sandgate-egress"
	egressDir       = "/run/sandgate-egress"
)

// egressContainer is the pod's egress point (see above).
func (k *Kubernetes) egressContainer() corev1.Container {
	no, yes, root := false, true, int64(0)
	always := corev1.ContainerRestartPolicyAlways
	cmd := []string{egressBin, "serve", "--dir", egressDir, "--install-agent", agentBin}
	if len(k.opts.EgressResolve) > 0 {
		cmd = append(cmd, "--resolve", point.FormatResolve(k.opts.EgressResolve))
	}
	return corev1.Container{
		Name:            containerEgress,
		Image:           k.opts.AgentImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		RestartPolicy:   &always,
		Command:         cmd,
		VolumeMounts:    []corev1.VolumeMount{{Name: containerEgress, MountPath: egressDir}, {Name: containerAgent, MountPath: agentDir}},
		Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
			Exec: &corev1.ExecAction{Command: []string{egressBin, "ready", "--dir", egressDir}},
		}},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &root,
			RunAsNonRoot:             &no,
			AllowPrivilegeEscalation: &no,
			ReadOnlyRootFilesystem:   &yes,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("5m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		},
	}
}

// egressVolume holds the point's control socket and state.
func egressVolume() corev1.Volume {
	return corev1.Volume{Name: containerEgress, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}}
}

// podState is what "sandgate-egress set" reads: a field left out keeps
// the point's value.
type podState struct {
	Policy *egress.Policy `json:"policy,omitempty"`
	Peers  *[]netip.Addr  `json:"peers,omitempty"`
}

// setPodPoint hands sandbox id's point st (an exec in its container).
func (k *Kubernetes) setPodPoint(ctx context.Context, id string, st podState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	ex, err := k.executor(id, containerEgress, []string{egressBin, "set", "--dir", egressDir})
	if err != nil {
		return err
	}
	stderr := &agentclient.Stderr{Max: 4 << 10}
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: bytes.NewReader(b), Stdout: stderr, Stderr: stderr})
	if err != nil {
		why := strings.TrimSpace(stderr.String())
		if why == "" {
			why = err.Error()
		}
		return providers.Wrap(providers.ErrUnavailable, err, fmt.Sprintf("sandbox %s: its egress point: %s", id, why))
	}
	return nil
}

// netCaps are the capabilities that would let the sandbox's container
// undo its point's rules (NET_ADMIN) or pass as the point (NET_RAW and
// NET_ADMIN may mark sockets).
var netCaps = []corev1.Capability{"NET_ADMIN", "NET_RAW"}

// heldNetCaps are the netCaps pod's sandbox container was given.
func heldNetCaps(pod *corev1.Pod) []string {
	var held []string
	for _, c := range pod.Spec.Containers {
		if c.Name != containerSandbox || c.SecurityContext == nil || c.SecurityContext.Capabilities == nil {
			continue
		}
		for _, add := range c.SecurityContext.Capabilities.Add {
			if slices.Contains(netCaps, corev1.Capability(strings.ToUpper(string(add)))) {
				held = append(held, string(add))
			}
		}
	}
	return held
}

// setSidecarEgress is SetEgress with the pod's point: pol is refused for
// a sandbox holding netCaps; the NetworkPolicy (where made) lets the
// point's connections out (all of them when pol has domain rules: their
// addresses are the point's to check); then the point takes pol.
func (k *Kubernetes) setSidecarEgress(ctx context.Context, id string, pol egress.Policy) error {
	pod, err := k.pod(ctx, id)
	if err != nil {
		return err
	}
	if held := heldNetCaps(pod); len(held) > 0 && !pol.None() {
		return providers.Errorf(providers.ErrUnsupported,
			"sandbox %s holds %s (cap_add), with which it could undo its egress point's rules: an egress policy other than none is refused for it",
			id, strings.Join(held, " and "))
	}
	if !k.opts.NoNetworkPolicy {
		if err := k.writeEgressRules(ctx, id, policyForNetpol(pol)); err != nil {
			return err
		}
	}
	return k.setPodPoint(ctx, id, podState{Policy: &pol})
}

// policyForNetpol is what the NetworkPolicy of a pod with a point must
// allow for pol: pol itself when it names addresses only, else
// everything (the point checks the names; it asks the cluster's DNS).
func policyForNetpol(pol egress.Policy) egress.Policy {
	if slices.ContainsFunc(slices.Concat(pol.Allow, pol.Deny), func(r egress.Rule) bool { return r.Domain != "" }) {
		return egress.Policy{Mode: egress.ModeAll}
	}
	return pol
}

// refreshPeers hands every member of group label g its peers: the other
// members' pod addresses. A member that cannot take them is logged (it
// does not reach the newest peers) unless it is must, whose error is
// returned.
func (k *Kubernetes) refreshPeers(ctx context.Context, g, must string) error {
	pods, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: LabelGroup + "=" + g + "," + LabelInstance + "=" + k.opts.InstanceID})
	if err != nil {
		return k.kind(err, "list the sandboxes of a group")
	}
	addrs := map[string]netip.Addr{}
	for _, p := range pods.Items {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil && p.DeletionTimestamp == nil {
			addrs[p.Name] = a
		}
	}
	var mustErr error
	for id := range addrs {
		peers := []netip.Addr{}
		for other, a := range addrs {
			if other != id {
				peers = append(peers, a)
			}
		}
		slices.SortFunc(peers, netip.Addr.Compare)
		if err := k.setPodPoint(ctx, id, podState{Peers: &peers}); err != nil {
			if id == must {
				mustErr = err
			} else {
				k.log.Warn("hand a group member its peers", "sandbox", id, "err", err)
			}
		}
	}
	return mustErr
}
