package providers

import "context"

// VolumeMount is one mount a sandbox gets at create (CreateSpec.Volumes).
// The service has checked everything provider-neutral: MountPath is
// absolute, clean and not over /, /proc, /dev or /sys; SubPath is
// relative, clean and has no ".." element; HostPath, when set, is a
// directory under one of the operator's roots with its symlinks resolved.
// The provider resolves SubPath inside its source without following a
// symlink out of it (a sandbox may plant one in a volume it writes).
type VolumeMount struct {
	Volume    string // a volume of this provider (Volumer), by id; "" when HostPath is set
	HostPath  string // a host directory (absolute, resolved)
	MountPath string
	ReadOnly  bool // the mount is read-only (writes fail with EROFS), not just a mode
	SubPath   string
}

// Volumer is implemented by providers that keep volumes: storage of a
// fixed size that outlives sandboxes and is mounted by any number of
// them (CreateSpec.Volumes). Ids are chosen by the service (vol-…).
type Volumer interface {
	// CreateVolume makes volume id of sizeBytes, empty and owned by
	// sandbox root. On error it leaves nothing behind.
	CreateVolume(ctx context.Context, id string, sizeBytes int64) error
	// DeleteVolume frees volume id and its storage; ErrNotFound if there
	// is none. The service calls it only once no sandbox mounts it.
	DeleteVolume(ctx context.Context, id string) error
}
