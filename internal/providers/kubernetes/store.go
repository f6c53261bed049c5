package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandgate/sandgate/internal/providers"
	"github.com/sandgate/sandgate/internal/store"
)

// Store returns the provider's store.SharedStore: every sandbox's
// record and live leases in the cluster, so that gateway replicas with
// the same instance id and lease secret serve every sandbox.
//
// One ConfigMap per sandbox, named like its pod and labelled like it
// (plus sandgate.kind=record), holds the record under "record", each
// lease under "lease.<id>" and the last activity under "active_at". A
// ConfigMap rather than annotations on the pod, because the record exists
// before the pod (a create writes it first) and after it (a stopped
// sandbox keeps its record); rather than a CRD, because a CRD needs
// cluster-admin to install and the gateway should run with a namespaced
// Role. Once the pod exists the ConfigMap is owned by it, so the cluster's
// garbage collector removes a record whose pod was deleted behind the
// gateway's back. Writes are read-modify-write with the object's
// resourceVersion (a conflict is read again and retried), reads are
// quorum reads of the API server: a lease deleted by one replica is
// absent for the next read of any. Every call is bounded by its ctx and
// by storeTimeout.
func (k *Kubernetes) Store() store.SharedStore { return (*recordStore)(k) }

type recordStore Kubernetes

var _ store.SharedStore = (*recordStore)(nil)

// LabelKind marks the record ConfigMaps.
const LabelKind = "sandgate.kind"

const (
	keyRecord   = "record"
	keyActiveAt = "active_at"
	leasePrefix = "lease."
)

// storeTimeout bounds one store call, retries on conflicts included,
// within its caller's context.
const storeTimeout = 30 * time.Second

func (s *recordStore) selector() string {
	return LabelInstance + "=" + s.opts.InstanceID + "," + LabelKind + "=record"
}

// Load returns every record and lease of this instance.
func (s *recordStore) Load(ctx context.Context) ([]store.Record, []store.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	list, err := s.cs.CoreV1().ConfigMaps(s.ns).List(ctx, metav1.ListOptions{LabelSelector: s.selector()})
	if err != nil {
		return nil, nil, (*Kubernetes)(s).kind(err, "list sandbox records")
	}
	var recs []store.Record
	var leases []store.Lease
	for i := range list.Items {
		r, ls, err := decode(&list.Items[i])
		if err != nil {
			return nil, nil, err
		}
		recs = append(recs, r)
		leases = append(leases, ls...)
	}
	return recs, leases, nil
}

// Sandbox reads sandbox id's record and leases.
func (s *recordStore) Sandbox(ctx context.Context, id string) (store.Record, []store.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	cm, err := s.cs.CoreV1().ConfigMaps(s.ns).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		return store.Record{}, nil, (*Kubernetes)(s).kind(err, "sandbox %s's record", id)
	}
	if cm.Labels[LabelInstance] != s.opts.InstanceID || cm.Labels[LabelKind] != "record" {
		return store.Record{}, nil, providers.Errorf(providers.ErrNotFound, "sandbox %s has no record", id)
	}
	return decode(cm)
}

func decode(cm *corev1.ConfigMap) (store.Record, []store.Lease, error) {
	var r store.Record
	if err := json.Unmarshal([]byte(cm.Data[keyRecord]), &r); err != nil {
		return store.Record{}, nil, fmt.Errorf("record %s: %w", cm.Name, err)
	}
	if at, err := time.Parse(time.RFC3339Nano, cm.Data[keyActiveAt]); err == nil && at.After(r.ActiveAt) {
		r.ActiveAt = at
	}
	var leases []store.Lease
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		if strings.HasPrefix(k, leasePrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		var l store.Lease
		if err := json.Unmarshal([]byte(cm.Data[k]), &l); err != nil {
			return store.Record{}, nil, fmt.Errorf("record %s: %s: %w", cm.Name, k, err)
		}
		leases = append(leases, l)
	}
	return r, leases, nil
}

// update applies change to sandbox id's ConfigMap data, creating the
// ConfigMap when create and it does not exist, retrying on conflicts. It
// makes the ConfigMap owned by the sandbox's pod once there is one.
func (s *recordStore) update(ctx context.Context, id string, create bool, change func(data map[string]string) error) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	cms := s.cs.CoreV1().ConfigMaps(s.ns)
	for {
		cm, err := cms.Get(ctx, id, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) && create:
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Name:      id,
				Namespace: s.ns,
				Labels:    map[string]string{LabelSandbox: id, LabelInstance: s.opts.InstanceID, LabelKind: "record"},
			}, Data: map[string]string{}}
		case err != nil:
			return (*Kubernetes)(s).kind(err, "sandbox %s's record", id)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		if err := change(cm.Data); err != nil {
			return err
		}
		if len(cm.OwnerReferences) == 0 {
			if pod, err := s.cs.CoreV1().Pods(s.ns).Get(ctx, id, metav1.GetOptions{}); err == nil && pod.Labels[LabelSandbox] == id {
				cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
			}
		}
		if cm.ResourceVersion == "" {
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
		} else {
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			continue // another replica wrote it meanwhile: read it again
		}
		if err != nil {
			return (*Kubernetes)(s).kind(err, "write sandbox %s's record", id)
		}
		return nil
	}
}

func putJSON(data map[string]string, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	data[key] = string(b)
	return nil
}

// PutRecord writes r and, when l is not nil, one of its leases, in one
// update.
func (s *recordStore) PutRecord(ctx context.Context, r store.Record, l *store.Lease) error {
	r.ActiveAt = time.Time{} // kept under its own key
	return s.update(ctx, r.ID, true, func(data map[string]string) error {
		if err := putJSON(data, keyRecord, r); err != nil {
			return err
		}
		if l != nil {
			return putJSON(data, leasePrefix+l.ID, *l)
		}
		return nil
	})
}

// PutLease adds l to its sandbox's record (ErrNotFound when the record is
// gone).
func (s *recordStore) PutLease(ctx context.Context, l store.Lease) error {
	return s.update(ctx, l.SandboxID, false, func(data map[string]string) error {
		return putJSON(data, leasePrefix+l.ID, l)
	})
}

// DeleteLeases removes the named leases in one update of the record (so
// another replica reads all of them or none); a missing record or lease
// is no error.
func (s *recordStore) DeleteLeases(ctx context.Context, sandboxID string, leaseIDs []string) error {
	err := s.update(ctx, sandboxID, false, func(data map[string]string) error {
		for _, id := range leaseIDs {
			delete(data, leasePrefix+id)
		}
		return nil
	})
	if providers.Kind(err) == providers.ErrNotFound {
		return nil
	}
	return err
}

// DeleteSandbox removes the record and its leases.
func (s *recordStore) DeleteSandbox(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	err := s.cs.CoreV1().ConfigMaps(s.ns).Delete(ctx, id, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return (*Kubernetes)(s).kind(err, "delete sandbox %s's record", id)
	}
	return nil
}

// Touch records activity on sandbox id at at, unless the record holds a
// later one (replicas' writes may land in any order).
func (s *recordStore) Touch(ctx context.Context, id string, at time.Time) error {
	return s.update(ctx, id, false, func(data map[string]string) error {
		if was, err := time.Parse(time.RFC3339Nano, data[keyActiveAt]); err == nil && !at.After(was) {
			return nil
		}
		data[keyActiveAt] = at.UTC().Format(time.RFC3339Nano)
		return nil
	})
}

// Ping asks the API server (the provider's Ping, bounded).
func (s *recordStore) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	return (*Kubernetes)(s).Ping(ctx)
}

// Close is a no-op: the provider owns the client.
func (s *recordStore) Close() error { return nil }
