package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
)

// Volumes. A volume is a PersistentVolumeClaim named by its id, labelled
// with the instance and sandgate.kind=volume, asking for its size with
// access mode ReadWriteOnce and the namespace's default storage class
// (Options.StorageClass names another). The cluster binds it: by a
// provisioner of that class, or to a PersistentVolume an operator made; a
// cluster with neither leaves it Pending, and a sandbox mounting it is
// not scheduled (its create fails at its ready timeout naming the
// claim). ReadWriteOnce lets every pod of one node mount it, which is
// where a local provisioner's volume pins them; sandboxes on several nodes
// need a class that offers ReadWriteMany. A mount is the pod's
// persistentVolumeClaim volume with readOnly on both the volume and the
// mount (the kubelet mounts it read-only) and subPath, which the kubelet
// resolves without following a symlink out of the volume.
//
// The gateway's record of the volume (store.Volume) is an annotation of
// the claim: the store is the cluster's, like the sandboxes' records.

var (
	_ providers.Volumer = (*Kubernetes)(nil)
	_ store.VolumeStore = (*recordStore)(nil)
)

// annotationVolume holds the JSON store.Volume of a claim.
const annotationVolume = "sandgate.volume"

func (k *Kubernetes) volumeSelector() string {
	return LabelInstance + "=" + k.opts.InstanceID + "," + LabelKind + "=volume"
}

// CreateVolume makes volume id's claim of sizeBytes.
func (k *Kubernetes) CreateVolume(ctx context.Context, id string, sizeBytes int64) error {
	size := resource.NewQuantity(sizeBytes>>20<<20, resource.BinarySI)
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      id,
			Namespace: k.ns,
			Labels:    map[string]string{LabelInstance: k.opts.InstanceID, LabelKind: "volume"},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *size}},
		},
	}
	if k.opts.StorageClass != "" {
		sc := k.opts.StorageClass
		pvc.Spec.StorageClassName = &sc
	}
	if _, err := k.cs.CoreV1().PersistentVolumeClaims(k.ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return providers.Errorf(providers.ErrConflict, "volume %s exists", id)
		}
		return k.kind(err, "create volume %s", id)
	}
	return nil
}

// DeleteVolume deletes volume id's claim (its storage goes as the
// class's reclaim policy says).
func (k *Kubernetes) DeleteVolume(ctx context.Context, id string) error {
	pvcs := k.cs.CoreV1().PersistentVolumeClaims(k.ns)
	pvc, err := pvcs.Get(ctx, id, metav1.GetOptions{})
	// One being deleted (its storage released once no pod uses it) is gone.
	if err == nil && (pvc.Labels[LabelInstance] != k.opts.InstanceID || pvc.DeletionTimestamp != nil) {
		err = apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), id)
	}
	if err == nil {
		err = pvcs.Delete(ctx, id, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pvc.UID}})
	}
	if apierrors.IsNotFound(err) {
		return providers.Errorf(providers.ErrNotFound, "volume %s not found", id)
	}
	if err != nil {
		return k.kind(err, "delete volume %s", id)
	}
	return nil
}

// podVolumes adds spec's volume mounts to the pod's volumes and the
// sandbox container's mounts. A host_path is refused: a host directory
// is one node's.
func podVolumes(spec providers.CreateSpec, pod *corev1.Pod) error {
	var bad providers.InvalidFields
	c := &pod.Spec.Containers[0]
	for i, v := range spec.Volumes {
		if v.HostPath != "" {
			bad.Add("volumes["+strconv.Itoa(i)+"].host_path", "not on the kubernetes provider (a host directory is one node's): use a volume")
			continue
		}
		name := "sandgate-vol-" + strconv.Itoa(i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.Volume, ReadOnly: v.ReadOnly}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: v.MountPath, ReadOnly: v.ReadOnly, SubPath: v.SubPath})
	}
	return bad.Err()
}

// unboundClaims adds to err, a create's failure, which of its volumes'
// claims the cluster has not bound (the likely reason its pod was not
// scheduled).
func (k *Kubernetes) unboundClaims(ctx context.Context, spec providers.CreateSpec, err error) error {
	if providers.Kind(err) != providers.ErrUnavailable {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var unbound []string
	for _, v := range spec.Volumes {
		pvc, gerr := k.cs.CoreV1().PersistentVolumeClaims(k.ns).Get(ctx, v.Volume, metav1.GetOptions{})
		if gerr == nil && pvc.Status.Phase != corev1.ClaimBound && !slices.Contains(unbound, v.Volume) {
			unbound = append(unbound, v.Volume)
		}
	}
	if len(unbound) == 0 {
		return err
	}
	return providers.Errorf(providers.ErrUnavailable, "%s; volume %s: its claim is not bound (the cluster has no provisioner for it, or no volume to bind it to)",
		providers.Message(err), strings.Join(unbound, ", "))
}

// LoadVolumes returns the volumes recorded on this instance's claims.
func (s *recordStore) LoadVolumes(ctx context.Context) ([]store.Volume, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	list, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{LabelSelector: (*Kubernetes)(s).volumeSelector()})
	if err != nil {
		return nil, (*Kubernetes)(s).kind(err, "list volumes")
	}
	var out []store.Volume
	for _, pvc := range list.Items {
		raw, ok := pvc.Annotations[annotationVolume]
		if !ok {
			continue // a create that did not get to record it
		}
		var v store.Volume
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			return nil, fmt.Errorf("volume %s: %w", pvc.Name, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// PutVolume records v on its claim.
func (s *recordStore) PutVolume(ctx context.Context, v store.Volume) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{annotationVolume: string(raw)}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	if _, err := s.cs.CoreV1().PersistentVolumeClaims(s.ns).Patch(ctx, v.ID, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return (*Kubernetes)(s).kind(err, "record volume %s", v.ID)
	}
	return nil
}

// DeleteVolume forgets volume id: its record went with its claim.
func (s *recordStore) DeleteVolume(ctx context.Context, id string) error { return nil }
