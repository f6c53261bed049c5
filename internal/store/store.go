// Package store holds what the gateway persists about its sandboxes so that
// it survives a restart and is shared by replicas: the records, leases and
// snapshots, the interfaces a backing store implements, and the default
// one, a bbolt file (see Open). It imports nothing of the gateway but the
// provider contracts, so the service and a provider that keeps the store
// (the kubernetes one, in the cluster) both depend on it, not on each other.
package store

import (
	"context"
	"github.com/sandgate/sandgate/internal/egress"
	"time"

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
	// Volumes are the ids of the volumes the sandbox mounts: a volume is
	// not deleted while a live sandbox mounts it.
	Volumes []string `json:"volumes,omitempty"`
	// ActiveAt is the last activity a replica recorded in a SharedStore
	// (not kept by the default store).
	ActiveAt time.Time `json:"active_at,omitempty"`
	// Egress is the sandbox's egress policy; nil: none.
	Egress *egress.Policy `json:"egress,omitempty"`

	// Group is the name of the sandbox's group as its create gave it ("":
	// none); GroupID is the opaque id the service derives from the API key
	// and that name (what the provider connects).
	Group   string `json:"group,omitempty"`
	GroupID string `json:"group_id,omitempty"`
	// Hostname is its host name ("" in records older than groups: the
	// provider's default); Aliases are further names its group knows it by.
	Hostname string   `json:"hostname,omitempty"`
	Aliases  []string `json:"aliases,omitempty"`
	// Address is where the other members of its group reach it ("": not
	// in a group); it may change when a gateway restart restores the group.
	Address string `json:"network_address,omitempty"`
	// Hosts are the sandbox's own host entries (name → address), written
	// into its /etc/hosts after its group's names.
	Hosts map[string]string `json:"hosts,omitempty"`
	// CapAdd are the capabilities its create added (names without CAP_).
	CapAdd []string `json:"cap_add,omitempty"`
	// PauseOnExpiry: at ExpiresAt the sandbox is paused, not stopped, and
	// then has no expiry until it is resumed (which starts a new TTL).
	PauseOnExpiry bool `json:"pause_on_expiry,omitempty"`
}

// Scope is what a lease allows.
type Scope string

const (
	// ScopeOwner allows everything, including delete and minting owner leases.
	ScopeOwner Scope = "owner"
	// ScopeOperate allows exec, files, PTY, status, endpoints, minting
	// operate leases and releasing itself.
	ScopeOperate Scope = "operate"
)

// Valid reports whether s is one of the scopes above.
func (s Scope) Valid() bool { return s == ScopeOwner || s == ScopeOperate }

// Covers reports whether a lease of scope s may do what needs.
func (s Scope) Covers(need Scope) bool { return s == ScopeOwner || need == ScopeOperate }

// Lease is one live grant of access to a sandbox. A token is valid only
// while its lease is in the store, and grants what the lease says: the
// token names it, the stored lease decides.
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

// Snapshot is a captured sandbox filesystem, owned by the key that created
// it.
type Snapshot struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"` // the source (which may be gone)
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	Creator   string    `json:"creator,omitempty"` // fingerprint of the owning API key
	Provider  string    `json:"provider"`
	Image     string    `json:"image,omitempty"` // the source's: a sandbox made from it uses it
	Workdir   string    `json:"workdir"`
	// Internal: made by a fork, removed with the last sandbox made from it.
	Internal bool `json:"internal,omitempty"`
	// Deleted: deleted by its owner while sandboxes made from it lived;
	// hidden from the owner, removed with the last of them.
	Deleted bool `json:"deleted,omitempty"`
}

// Store is where the service keeps records and leases so that they
// survive a restart. Every write is durable before it returns. Every
// method but Close stops, with ctx's error, once ctx is done (a call
// already committed stays committed).
type Store interface {
	// Load returns every record and lease.
	Load(ctx context.Context) ([]Record, []Lease, error)
	// PutRecord writes r and, when l is not nil, one of its leases,
	// atomically.
	PutRecord(ctx context.Context, r Record, l *Lease) error
	// PutLease adds l to its sandbox; a store that keeps leases in their
	// sandbox's record may refuse one whose record is gone (ErrNotFound).
	PutLease(ctx context.Context, l Lease) error
	// DeleteLeases removes the named leases of sandbox sandboxID,
	// atomically; ids it does not hold are no error.
	DeleteLeases(ctx context.Context, sandboxID string, leaseIDs []string) error
	// DeleteSandbox removes a record and all its leases.
	DeleteSandbox(ctx context.Context, id string) error
	// Ping fails once the store is closed or cannot be reached.
	Ping(ctx context.Context) error
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
	Sandbox(ctx context.Context, id string) (Record, []Lease, error)
	// Touch records activity on sandbox id at at (for idle timeouts kept
	// by every replica); an at older than the one recorded is no change.
	Touch(ctx context.Context, id string, at time.Time) error
}

// SnapshotStore is a Store that also keeps snapshots (the default one
// does; a gateway whose store does not cannot snapshot).
type SnapshotStore interface {
	LoadSnapshots(ctx context.Context) ([]Snapshot, error)
	PutSnapshot(ctx context.Context, sn Snapshot) error
	DeleteSnapshot(ctx context.Context, id string) error
}

// Volume is storage of a fixed size, owned by the key that created it,
// that sandboxes mount (its backing is the provider's).
type Volume struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"` // unique per key
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	Creator   string    `json:"creator,omitempty"` // fingerprint of the owning API key
	Provider  string    `json:"provider"`
}

// VolumeStore is a Store that also keeps volumes (the default one does;
// a gateway whose store does not has no volumes).
type VolumeStore interface {
	LoadVolumes(ctx context.Context) ([]Volume, error)
	PutVolume(ctx context.Context, v Volume) error
	DeleteVolume(ctx context.Context, id string) error
}
