package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/sandgate/sandgate/internal/providers"
)

// agentDir is where the agent volume is mounted in the sandbox's
// container (read-only), as in the docker provider.
const (
	agentDir = "/.sandgate"
	agentBin = agentDir + "/sandgate-agent"
)

// keepAlive is the command of a sandbox created without an entrypoint.
// The pod's PID 1 (pause, with a shared process namespace) reaps orphans;
// the shell only has to stay.
var keepAlive = []string{"/bin/sh", "-c", "while :; do sleep 3600; done"}

// Create makes sandbox spec.ID's NetworkPolicy and pod (netpol.go) and
// returns once its agent runs a command in the workdir. A pod that is not
// running within spec.ReadyTimeout (unschedulable, image missing,
// crashing) is removed and the error names what the pod said. A policy
// the API server refuses (no permission) fails the create with
// ErrUnavailable and no pod.
func (k *Kubernetes) Create(ctx context.Context, spec providers.CreateSpec) (providers.Sandbox, error) {
	if spec.Image == "" {
		return providers.Sandbox{}, providers.Errorf(providers.ErrInvalid, "image is required by the kubernetes provider")
	}
	for key := range spec.Options {
		return providers.Sandbox{}, providers.InvalidFields{{Field: "provider_options." + key, Message: "unknown option for the kubernetes provider"}}
	}
	workdir := spec.Workdir
	if workdir == "" {
		workdir = "/"
	}
	pod, extra, err := k.podFor(spec, workdir)
	if err != nil {
		return providers.Sandbox{}, err
	}
	if !k.opts.NoNetworkPolicy {
		if err := k.createPolicy(ctx, pod); err != nil {
			return providers.Sandbox{}, err
		}
	}
	// From here on, a failure removes what this call made, even when ctx
	// is done.
	detached := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	}
	made, err := k.cs.CoreV1().Pods(k.ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		// Not the pod: one of that name may be another sandbox's.
		if !k.opts.NoNetworkPolicy {
			rctx, cancel := detached()
			defer cancel()
			if err := k.deletePolicy(rctx, spec.ID); err != nil {
				k.log.Error("removing a half-made sandbox", "sandbox", spec.ID, "err", err)
			}
		}
		return providers.Sandbox{}, k.kind(err, "create sandbox %s", spec.ID)
	}
	ok := false
	defer func() {
		if ok {
			return
		}
		k.links.Drop(spec.ID)
		rctx, cancel := detached()
		defer cancel()
		if err := k.remove(rctx, spec.ID); err != nil {
			k.log.Error("removing a half-made sandbox", "sandbox", spec.ID, "err", err)
		}
	}()
	if !k.opts.NoNetworkPolicy {
		if err := k.ownPolicy(ctx, made); err != nil {
			return providers.Sandbox{}, err
		}
	}
	if err := k.waitReady(ctx, spec.ID, workdir, spec.ReadyTimeout); err != nil {
		return providers.Sandbox{}, k.unboundClaims(ctx, spec, err)
	}
	ok = true
	extra["pod"] = k.ns + "/" + spec.ID
	return providers.Sandbox{ID: spec.ID, Workdir: workdir, Extra: extra}, nil
}

// podFor builds sandbox spec's pod, and what the sandbox's Extra says
// about its limits.
func (k *Kubernetes) podFor(spec providers.CreateSpec, workdir string) (*corev1.Pod, map[string]any, error) {
	env := make([]corev1.EnvVar, 0, len(spec.Env))
	for name, v := range spec.Env {
		env = append(env, corev1.EnvVar{Name: name, Value: v})
	}
	sort.Slice(env, func(i, j int) bool { return env[i].Name < env[j].Name })
	command := keepAlive
	if len(spec.Entrypoint) > 0 {
		command = spec.Entrypoint
	}
	res, extra, err := k.resources(spec.Resources)
	if err != nil {
		return nil, nil, err
	}
	var ports []corev1.ContainerPort // informational: reached by port-forward (ports.go)
	for _, p := range spec.Ports {
		ports = append(ports, corev1.ContainerPort{ContainerPort: int32(p), Protocol: corev1.ProtocolTCP})
	}
	no, yes := false, true
	always := corev1.ContainerRestartPolicyAlways
	grace := int64(1)
	sec := &corev1.SecurityContext{
		AllowPrivilegeEscalation: &no,
		Capabilities:             &corev1.Capabilities{Drop: DefaultCapDrop},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	volumes := []corev1.Volume{{Name: containerAgent, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	var podSec *corev1.PodSecurityContext
	var workMount []corev1.VolumeMount
	if k.opts.RunAsNonRoot {
		uid := int64(nonRootUID)
		sec.RunAsUser, sec.RunAsGroup, sec.RunAsNonRoot = &uid, &uid, &yes
		// The runtime makes a missing workdir as root: the sandbox's user
		// gets one of its own (an emptyDir of its group) instead.
		podSec = &corev1.PodSecurityContext{FSGroup: &uid}
		// Nor may it make the agent's socket on /dev: a directory of its
		// own holds it.
		volumes = append(volumes, corev1.Volume{Name: "sandgate-run", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
		workMount = append(workMount, corev1.VolumeMount{Name: "sandgate-run", MountPath: nonRootRunDir})
		if workdir != "/" {
			volumes = append(volumes, corev1.Volume{Name: "workdir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			workMount = append(workMount, corev1.VolumeMount{Name: "workdir", MountPath: workdir})
		}
	}
	if spec.ShmBytes > 0 {
		// A tmpfs the kubelet sizes to the limit (memory-backed volumes
		// are sized since Kubernetes 1.22), charged to the pod's memory.
		size := resource.NewQuantity(spec.ShmBytes, resource.BinarySI)
		volumes = append(volumes, corev1.Volume{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: size}}})
		workMount = append(workMount, corev1.VolumeMount{Name: "shm", MountPath: "/dev/shm"})
	}
	// The sandbox's container keeps CapAdd (the service checked them
	// against the operator's list): added, and no longer dropped (the
	// runtime drops after it adds). The agent's sidecar keeps sec.
	sandboxSec := *sec
	sandboxSec.Capabilities = &corev1.Capabilities{}
	for _, c := range DefaultCapDrop {
		if !slices.Contains(spec.CapAdd, string(c)) {
			sandboxSec.Capabilities.Drop = append(sandboxSec.Capabilities.Drop, c)
		}
	}
	for _, c := range spec.CapAdd {
		sandboxSec.Capabilities.Add = append(sandboxSec.Capabilities.Add, corev1.Capability(c))
	}
	hostname := spec.Hostname
	if hostname == "" {
		hostname = "sandbox"
	}
	mount := func(ro bool) []corev1.VolumeMount {
		return []corev1.VolumeMount{{Name: containerAgent, MountPath: agentDir, ReadOnly: ro}}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      spec.ID,
			Namespace: k.ns,
			Labels:    map[string]string{LabelSandbox: spec.ID, LabelInstance: k.opts.InstanceID},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: &grace,
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			ShareProcessNamespace:         &yes,
			Hostname:                      hostname,
			SecurityContext:               podSec,
			// A sidecar (an init container that stays): the sandbox's
			// container starts once it runs, not once it exits, which the
			// kubelet would notice only at its next relist (up to a second).
			InitContainers: []corev1.Container{{
				Name:            containerAgent,
				Image:           k.opts.AgentImage,
				ImagePullPolicy: corev1.PullIfNotPresent,
				RestartPolicy:   &always,
				Command:         []string{"/sandgate-agent", "install", "--stay", agentBin},
				VolumeMounts:    mount(false),
				SecurityContext: sec,
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("8Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
				},
			}},
			Containers: []corev1.Container{{
				Name:            containerSandbox,
				Image:           spec.Image,
				ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         command,
				WorkingDir:      workdir,
				Ports:           ports,
				Env:             env,
				Resources:       res,
				VolumeMounts:    append(mount(true), workMount...),
				SecurityContext: &sandboxSec,
			}},
			Volumes: volumes,
		},
	}
	if k.opts.EgressSidecar {
		// In the agent's sidecar's place: it installs the agent too, so
		// the sandbox's container starts as soon (sidecar.go).
		pod.Spec.InitContainers = []corev1.Container{k.egressContainer()}
		pod.Spec.Volumes = append(pod.Spec.Volumes, egressVolume())
	}
	if err := podVolumes(spec, pod); err != nil {
		return nil, nil, err
	}
	return pod, extra, nil
}

// resources are the container's requests and limits: cpu and memory
// limits (the create's, else the provider's defaults), small requests
// (10 millicores, 16 MiB: a sandbox mostly idles between commands, and
// requests of a share of the limits would let a node schedule only a few;
// the kubelet's eviction and the limits guard the node), and ephemeral
// storage for disk_gib. GPUs are refused.
func (k *Kubernetes) resources(r providers.Resources) (corev1.ResourceRequirements, map[string]any, error) {
	if r.GPU != nil && *r.GPU > 0 {
		return corev1.ResourceRequirements{}, nil, providers.InvalidFields{{Field: "resources.gpu", Message: "GPUs are not supported by the kubernetes provider yet"}}
	}
	limits, requests := corev1.ResourceList{}, corev1.ResourceList{}
	extra := map[string]any{}
	cpu := k.opts.DefaultCPU
	if r.CPU != nil {
		cpu = *r.CPU
	}
	if cpu > 0 {
		milli := int64(cpu * 1000)
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(milli, resource.DecimalSI)
		requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(min(milli, requestMilliCPU), resource.DecimalSI)
		extra["cpu_limit"] = cpu
	}
	mem := k.opts.DefaultMemoryMiB
	if r.MemoryMiB != nil {
		mem = *r.MemoryMiB
	}
	if mem > 0 {
		limits[corev1.ResourceMemory] = *resource.NewQuantity(mem<<20, resource.BinarySI)
		requests[corev1.ResourceMemory] = *resource.NewQuantity(min(mem, requestMemoryMiB)<<20, resource.BinarySI)
		extra["memory_limit_mib"] = mem
	}
	if r.DiskGiB != nil && *r.DiskGiB > 0 {
		b := int64(*r.DiskGiB * (1 << 30))
		limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(b, resource.BinarySI)
		extra["disk_limit"] = "ephemeral-storage " + strconv.FormatFloat(*r.DiskGiB, 'f', -1, 64) + " GiB (enforced by the kubelet's eviction)"
	}
	return corev1.ResourceRequirements{Limits: limits, Requests: requests}, extra, nil
}

// With Options.RunAsNonRoot: the sandbox's user (nobody), and the
// directory of the agent's socket.
const (
	nonRootUID    = 65534
	nonRootRunDir = "/.sandgate-run"
)

// A sandbox's requests (see resources).
const (
	requestMilliCPU  = 10
	requestMemoryMiB = 16
)

// waitReady follows the pod (a watch, and a read at least every second)
// until it runs, then starts its agent and checks, through it, that a
// command runs in workdir. A pod that fails, or whose image cannot be
// had, fails at once; one not running within timeout fails naming what
// its conditions say (unschedulable, ...).
func (k *Kubernetes) waitReady(ctx context.Context, id, workdir string, timeout time.Duration) error {
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var events <-chan watch.Event
	if w, err := k.cs.CoreV1().Pods(k.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + id}); err == nil {
		defer w.Stop()
		events = w.ResultChan()
	}
	var last error
	var pod *corev1.Pod
	for {
		if pod == nil {
			var err error
			pod, err = k.pod(ctx, id)
			switch {
			case err != nil && providers.Kind(err) == providers.ErrUnavailable:
				last = err
			case err != nil && ctx.Err() == nil:
				return err
			}
		}
		if pod != nil {
			if why := stuck(pod); why != "" {
				return providers.Errorf(providers.ErrInvalid, "sandbox %s cannot start: %s", id, why)
			}
			st, why := stateOf(pod)
			switch st {
			case providers.StateRunning:
				last = k.links.Probe(ctx, id, workdir)
				if last == nil {
					return nil
				}
				if providers.Kind(last) == providers.ErrInvalid {
					return last
				}
				if why := k.links.Broken(id); why != "" {
					return providers.Errorf(providers.ErrUnavailable, "sandbox %s: %s", id, why)
				}
			case providers.StateStarting:
				last = errors.New(pending(pod))
			default:
				if why == "" {
					why = string(st)
				}
				return providers.Errorf(providers.ErrInvalid, "sandbox %s exited during start (%s): check the image and entrypoint", id, why)
			}
		}
		// A running pod whose agent did not answer yet (its sidecar may
		// still be copying it) is asked again soon; anything else waits
		// for the pod to change.
		next := time.Second
		if pod != nil && last != nil && providers.Kind(last) != providers.ErrInvalid {
			if st, _ := stateOf(pod); st == providers.StateRunning {
				next = 50 * time.Millisecond
			}
		}
		pod = nil
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				msg := fmt.Sprintf("sandbox %s was not ready within %v", id, timeout)
				if last != nil {
					msg += ": " + last.Error()
				}
				return providers.Errorf(providers.ErrUnavailable, "%s", msg)
			}
			return fmt.Errorf("start sandbox %s: %w", id, ctx.Err())
		case ev, ok := <-events:
			if !ok {
				events = nil // the watch ended: the timer reads from now on
			} else if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted {
				pod = p
			}
		case <-t.C:
		}
		t.Stop()
	}
}

// stuck says why a pending pod will not start without a change (its image
// cannot be had, its config is bad), or "".
func stuck(pod *corev1.Pod) string {
	for _, cs := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		w := cs.State.Waiting
		if w == nil {
			continue
		}
		switch w.Reason {
		case "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError", "CreateContainerError", "RunContainerError":
			return fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message)
		}
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("the sidecar %s failed (%s)", cs.Name, terminatedReason(t))
		}
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			return fmt.Sprintf("the sidecar %s failed: %s: %s", cs.Name, w.Reason, w.Message)
		}
	}
	return ""
}

// pending says what a pending pod waits for: its conditions that are not
// true (PodScheduled=False: Unschedulable: 0/1 nodes are available: ...).
func pending(pod *corev1.Pod) string {
	var parts []string
	for _, c := range pod.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			continue
		}
		p := string(c.Type) + "=" + string(c.Status)
		if c.Reason != "" {
			p += ": " + c.Reason
		}
		if c.Message != "" {
			p += ": " + c.Message
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return "pod " + pod.Name + " is " + string(pod.Status.Phase)
	}
	return "pod " + pod.Name + " is " + string(pod.Status.Phase) + " (" + strings.Join(parts, "; ") + ")"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
