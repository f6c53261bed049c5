package store

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketSandboxes = []byte("sandboxes") // id -> Record
	bucketLeases    = []byte("leases")    // sandbox id -> bucket(lease id -> Lease)
	bucketSnapshots = []byte("snapshots") // id -> Snapshot
	bucketVolumes   = []byte("volumes")   // id -> Volume
)

// FileName is the default store's file in the state dir.
const FileName = "sandgate.db"

// Bolt is the default Store, SnapshotStore and VolumeStore: a bbolt file in the state
// dir. Every write is one transaction, synced before it returns; a call
// whose ctx is already done does nothing (bbolt itself cannot be
// interrupted). It is safe for concurrent use.
type Bolt struct {
	db *bolt.DB
}

var (
	_ Store         = (*Bolt)(nil)
	_ SnapshotStore = (*Bolt)(nil)
	_ VolumeStore   = (*Bolt)(nil)
)

// Open opens (creating it if need be) the store file FileName in dir. It
// waits at most 5 s for another process holding the file.
func Open(dir string) (*Bolt, error) {
	db, err := bolt.Open(filepath.Join(dir, FileName), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open state store: %w", err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketSandboxes, bucketLeases, bucketSnapshots, bucketVolumes} {
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
	return &Bolt{db: db}, nil
}

// Close closes the file; every later call fails.
func (s *Bolt) Close() error { return s.db.Close() }

func (s *Bolt) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(fn)
}

func (s *Bolt) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.Update(fn)
}

// Ping fails once the store is closed.
func (s *Bolt) Ping(ctx context.Context) error {
	return s.view(ctx, func(*bolt.Tx) error { return nil })
}

// Load returns every record and lease.
func (s *Bolt) Load(ctx context.Context) ([]Record, []Lease, error) {
	var recs []Record
	var leases []Lease
	err := s.view(ctx, func(tx *bolt.Tx) error {
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
func (s *Bolt) PutRecord(ctx context.Context, r Record, l *Lease) error {
	return s.update(ctx, func(tx *bolt.Tx) error {
		if err := putJSON(tx.Bucket(bucketSandboxes), r.ID, r); err != nil {
			return err
		}
		if l != nil {
			return putLease(tx, *l)
		}
		return nil
	})
}

// PutLease writes l.
func (s *Bolt) PutLease(ctx context.Context, l Lease) error {
	return s.update(ctx, func(tx *bolt.Tx) error { return putLease(tx, l) })
}

func putLease(tx *bolt.Tx, l Lease) error {
	b, err := tx.Bucket(bucketLeases).CreateBucketIfNotExists([]byte(l.SandboxID))
	if err != nil {
		return err
	}
	return putJSON(b, l.ID, l)
}

func putJSON(b *bolt.Bucket, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), raw)
}

// DeleteLeases removes the named leases in one transaction.
func (s *Bolt) DeleteLeases(ctx context.Context, sandboxID string, leaseIDs []string) error {
	return s.update(ctx, func(tx *bolt.Tx) error {
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
func (s *Bolt) DeleteSandbox(ctx context.Context, id string) error {
	return s.update(ctx, func(tx *bolt.Tx) error {
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
func (s *Bolt) LoadSnapshots(ctx context.Context) ([]Snapshot, error) {
	return loadAll[Snapshot](ctx, s, bucketSnapshots, "snapshot")
}

// loadAll decodes every value of bucket b (its things are called what).
func loadAll[T any](ctx context.Context, s *Bolt, b []byte, what string) ([]T, error) {
	var out []T
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(b).ForEach(func(k, v []byte) error {
			var t T
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("%s %s: %w", what, k, err)
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}

// PutSnapshot writes sn.
func (s *Bolt) PutSnapshot(ctx context.Context, sn Snapshot) error {
	return s.update(ctx, func(tx *bolt.Tx) error { return putJSON(tx.Bucket(bucketSnapshots), sn.ID, sn) })
}

// DeleteSnapshot removes snapshot id's record.
func (s *Bolt) DeleteSnapshot(ctx context.Context, id string) error {
	return s.update(ctx, func(tx *bolt.Tx) error { return tx.Bucket(bucketSnapshots).Delete([]byte(id)) })
}

// LoadVolumes returns every volume.
func (s *Bolt) LoadVolumes(ctx context.Context) ([]Volume, error) {
	return loadAll[Volume](ctx, s, bucketVolumes, "volume")
}

// PutVolume writes v.
func (s *Bolt) PutVolume(ctx context.Context, v Volume) error {
	return s.update(ctx, func(tx *bolt.Tx) error { return putJSON(tx.Bucket(bucketVolumes), v.ID, v) })
}

// DeleteVolume removes volume id's record.
func (s *Bolt) DeleteVolume(ctx context.Context, id string) error {
	return s.update(ctx, func(tx *bolt.Tx) error { return tx.Bucket(bucketVolumes).Delete([]byte(id)) })
}
