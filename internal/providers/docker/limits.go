package docker

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/system"

	"github.com/sandgate/sandgate/internal/providers"
)

// securityOpt is every sandbox container's SecurityOpt. no-new-privileges
// keeps setuid binaries and file capabilities from raising a process's
// privileges (execs inherit it from the container). It names no seccomp or
// AppArmor profile on purpose: the daemon's defaults apply, and
// "seccomp=unconfined" must never appear here. MaskedPaths and
// ReadonlyPaths are left nil for the same reason: an empty list would
// clear the daemon's defaults (/proc/kcore masked, /proc/sys read-only).
var securityOpt = []string{"no-new-privileges:true"}

// Values of the "disk_limit" key a sandbox's Extra carries when the create
// asked for resources.disk_gib.
const (
	diskEnforced    = "enforced"
	diskNotEnforced = "not enforced"
)

// daemonFacts are what limits need to know about the daemon.
type daemonFacts struct {
	ncpu      int  // CPUs its containers can use; it refuses NanoCPUs above ncpu*1e9
	diskQuota bool // its storage driver may enforce StorageOpt size
}

// daemonFacts asks the daemon (Info) once and keeps the first answer;
// concurrent first callers may each ask. An unreachable daemon is
// ErrUnavailable and nothing is kept.
func (d *Docker) daemonFacts(ctx context.Context) (daemonFacts, error) {
	d.factsMu.Lock()
	f := d.facts
	d.factsMu.Unlock()
	if f != nil {
		return *f, nil
	}
	info, err := d.cli.Info(ctx)
	if err != nil {
		return daemonFacts{}, d.kind(err, "docker daemon info")
	}
	nf := daemonFacts{ncpu: info.NCPU, diskQuota: diskQuota(info)}
	if !nf.diskQuota {
		d.log.Info("this docker daemon cannot enforce disk limits: resources.disk_gib is accepted and not enforced",
			"storage_driver", info.Driver, "backing_filesystem", driverStatus(info, "Backing Filesystem"))
	}
	d.factsMu.Lock()
	defer d.factsMu.Unlock()
	if d.facts == nil {
		d.facts = &nf
	}
	return *d.facts, nil
}

// noDiskQuota records that the daemon refused StorageOpt size although
// Info made it look able (overlay2 on xfs mounted without pquota).
func (d *Docker) noDiskQuota() {
	d.factsMu.Lock()
	defer d.factsMu.Unlock()
	if d.facts != nil {
		d.facts.diskQuota = false
	}
}

// diskQuota reports whether the daemon's storage driver can limit a
// container's writable layer (StorageOpt size): overlay2 only on xfs
// (which must also be mounted with pquota; Info cannot tell, so a create
// that the daemon refuses for that is retried without the limit), btrfs
// and zfs. overlay2 on ext4, the common case, cannot.
func diskQuota(info system.Info) bool {
	switch info.Driver {
	case "btrfs", "zfs":
		return true
	case "overlay2":
		return driverStatus(info, "Backing Filesystem") == "xfs" && driverStatus(info, "Supports d_type") == "true"
	}
	return false
}

func driverStatus(info system.Info, key string) string {
	for _, kv := range info.DriverStatus {
		if kv[0] == key {
			return kv[1]
		}
	}
	return ""
}

// storageOptRefused reports whether a create failed because the daemon
// cannot apply StorageOpt.
func storageOptRefused(err error) bool {
	s := strings.ToLower(err.Error())
	return strings.Contains(s, "storage-opt") || strings.Contains(s, "quota")
}

// setLimits sets hc's memory, CPU, pids and disk limits: the create's
// resources where given, else the provider's defaults. It returns what a
// sandbox's Extra should say about them (disk_limit when disk_gib was
// asked for).
func (d *Docker) setLimits(hc *container.HostConfig, r providers.Resources, o createOptions, f daemonFacts) map[string]any {
	extra := map[string]any{}
	mem := d.opts.DefaultMemoryMiB
	if r.MemoryMiB != nil {
		mem = *r.MemoryMiB
	}
	if mem > 0 {
		hc.Memory = mem << 20
		hc.MemorySwap = hc.Memory // no swap beyond the limit
	}
	cpu := d.opts.DefaultCPU
	if r.CPU != nil {
		cpu = *r.CPU
	}
	if cpu > 0 {
		if f.ncpu > 0 {
			// More than the host has limits nothing, and the daemon
			// refuses it.
			cpu = min(cpu, float64(f.ncpu))
		}
		hc.NanoCPUs = int64(math.Round(cpu * 1e9))
	}
	pids := d.opts.PidsLimit
	if o.pidsLimit > 0 {
		pids = o.pidsLimit
	}
	if pids > 0 {
		hc.PidsLimit = &pids
	}
	if g := r.DiskGiB; g != nil && *g > 0 {
		if f.diskQuota {
			hc.StorageOpt = map[string]string{"size": fmt.Sprintf("%dM", int64(*g*1024))}
			extra["disk_limit"] = diskEnforced
		} else {
			extra["disk_limit"] = diskNotEnforced
		}
	}
	return extra
}
