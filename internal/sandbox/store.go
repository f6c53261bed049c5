package sandbox

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sandgate/sandgate/internal/providers"
)

// Record is what the gateway promised a client about one sandbox; it is
// persisted so that it survives a restart.
type Record struct {
	ID          string            `json:"id"`
	Provider    string            `json:"provider"`
	State       providers.State   `json:"state"`
	StateReason string            `json:"state_reason,omitempty"` // why it is in error
	Workdir     string            `json:"workdir"`
	Image       string            `json:"image,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   time.Time         `json:"expires_at"` // zero: no expiry
	TTL         time.Duration     `json:"ttl"`        // 0: no expiry
	IdleTimeout time.Duration     `json:"idle_timeout,omitempty"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	Ports       []int             `json:"ports,omitempty"`
	Extra       map[string]any    `json:"extra,omitempty"`
	Creator     string            `json:"creator,omitempty"` // fingerprint of the API key that created it
	// Env is added to every command's and session's environment: the
	// create's env of a sandbox claimed from a warm pool (one made by the
	// create has it from its start).
	Env map[string]string `json:"env,omitempty"`
	// Snapshot is the snapshot the sandbox was made from ("" = none).
	Snapshot string `json:"snapshot_id,omitempty"`
	// Resources are the create's (nil fields: the provider's defaults):
	// what the sandbox commits of the admission budget and its key's quotas.
	Resources providers.Resources `json:"resources"`
	// ActiveAt is the last activity a replica recorded in a SharedStore
	// (not kept by the default store).
	ActiveAt time.Time `json:"active_at,omitempty"`
}

// Lease is one live grant of access to a sandbox. A token is valid only
// while its lease is in the store, and grants what the lease says: the
// token names it, the stored lease decides (see Service.authorize).
//
// Leases form a tree per sandbox: Parent is the lease whose token minted
// this one, "" for a root (the create's owner lease, one minted with an
// API key, and every lease stored before parents were recorded). A lease
// is live only while every lease above it is in the store, so revoking a
// lease ends its whole subtree.
type Lease struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"`
	Scope     Scope     `json:"scope"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"` // zero: lives as long as the sandbox
	Parent    string    `json:"parent_id,omitempty"`
}

var (
	bucketSandboxes = []byte("sandboxes") // id -> Record
	bucketLeases    = []byte("leases")    // sandbox id -> bucket(lease id -> Lease)
	bucketSnapshots = []byte("snapshots") // id -> Snapshot
)

// SnapshotStore is a Store that also keeps snapshots (the default one
// does; a gateway whose store does not cannot snapshot).
type SnapshotStore interface {
	LoadSnapshots() ([]Snapshot, error)
	PutSnapshot(Snapshot) error
	DeleteSnapshot(id string) error
}

// Store is where the service keeps records and leases so that they
// survive a restart. Every write is durable before it returns.
type Store interface {
	// Load returns every record and lease.
	Load() ([]Record, []Lease, error)
	// PutRecord writes r and, when l is not nil, one of its leases,
	// atomically.
	PutRecord(r Record, l *Lease) error
	PutLease(l Lease) error
	// DeleteLeases removes the named leases of sandbox sandboxID,
	// atomically; ids it does not hold are no error.
	DeleteLeases(sandboxID string, leaseIDs []string) error
	// DeleteSandbox removes a record and all its leases.
	DeleteSandbox(id string) error
	// Ping fails once the store is closed or cannot be reached.
	Ping() error
	Close() error
}

// SharedStore is a Store other gateway replicas write too (the
// kubernetes provider's, in the cluster). The service reads a sandbox
// from it again for every call on it, so a lease released on one replica
// is refused by every other at once, and a sandbox made on one is served
// by all.
type SharedStore interface {
	Store
	// Sandbox reads sandbox id's record and leases as they are now;
	// providers.ErrNotFound when there is none.
	Sandbox(id string) (Record, []Lease, error)
	// Touch records activity on sandbox id at at (for idle timeouts kept
	// by every replica).
	Touch(id string, at time.Time) error
}

// store is the default Store: a bbolt file in the state dir. Every write
// is one transaction, synced before it returns.
type store struct {
	db *bolt.DB
}

func openStore(dir string) (*store, error) {
	db, err := bolt.Open(filepath.Join(dir, "sandgate.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state store: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketLeases, bucketSnapshots} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init state store: %w", err)
	}
	return &store{db: db}, nil
}

func (s *store) Close() error { return s.db.Close() }

// Ping fails once the store is closed.
func (s *store) Ping() error { return s.db.View(func(*bolt.Tx) error { return nil }) }

// Load returns every record and lease.
func (s *store) Load() ([]Record, []Lease, error) {
	var recs []Record
	var leases []Lease
	err := s.db.View(func(tx *bolt.Tx) error {
		err := tx.Bucket(bucketSandboxes).ForEach(func(k, v []byte) error {
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("record %s: %w", k, err)
			}
			recs = append(recs, r)
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketLeases).ForEachBucket(func(sid []byte) error {
			return tx.Bucket(bucketLeases).Bucket(sid).ForEach(func(k, v []byte) error {
				var l Lease
				if err := json.Unmarshal(v, &l); err != nil {
					return fmt.Errorf("lease %s: %w", k, err)
				}
				leases = append(leases, l)
				return nil
			})
		})
	})
	return recs, leases, err
}

// PutRecord writes r and, when l is not nil, one of its leases, atomically.
func (s *store) PutRecord(r Record, l *Lease) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		v, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucketSandboxes).Put([]byte(r.ID), v); err != nil {
			return err
		}
		if l != nil {
			return putLease(tx, *l)
		}
		return nil
	})
}

func (s *store) PutLease(l Lease) error {
	return s.db.Update(func(tx *bolt.Tx) error { return putLease(tx, l) })
}

func putLease(tx *bolt.Tx, l Lease) error {
	b, err := tx.Bucket(bucketLeases).CreateBucketIfNotExists([]byte(l.SandboxID))
	if err != nil {
		return err
	}
	v, err := json.Marshal(l)
	if err != nil {
		return err
	}
	return b.Put([]byte(l.ID), v)
}

// DeleteLeases removes the named leases in one transaction.
func (s *store) DeleteLeases(sandboxID string, leaseIDs []string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases).Bucket([]byte(sandboxID))
		if b == nil {
			return nil
		}
		for _, id := range leaseIDs {
			if err := b.Delete([]byte(id)); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteSandbox removes a record and all its leases.
func (s *store) DeleteSandbox(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketSandboxes).Delete([]byte(id)); err != nil {
			return err
		}
		if tx.Bucket(bucketLeases).Bucket([]byte(id)) != nil {
			return tx.Bucket(bucketLeases).DeleteBucket([]byte(id))
		}
		return nil
	})
}

// LoadSnapshots returns every snapshot.
func (s *store) LoadSnapshots() ([]Snapshot, error) {
	var out []Snapshot
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketSnapshots).ForEach(func(k, v []byte) error {
			var sn Snapshot
			if err := json.Unmarshal(v, &sn); err != nil {
				return fmt.Errorf("snapshot %s: %w", k, err)
			}
			out = append(out, sn)
			return nil
		})
	})
	return out, err
}

// PutSnapshot writes sn.
func (s *store) PutSnapshot(sn Snapshot) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		v, err := json.Marshal(sn)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketSnapshots).Put([]byte(sn.ID), v)
	})
}

// DeleteSnapshot removes snapshot id's record.
func (s *store) DeleteSnapshot(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketSnapshots).Delete([]byte(id)) })
}
