package sandbox

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// Ceilings are the operator's upper bounds on what one request may ask
// for, so that no tenant can ask for more than the host has or make the
// gateway hold more than it should. A zero field is no ceiling. A value
// over a ceiling is an ErrInvalid (400) naming the field and the ceiling,
// listed with every other problem of the request; nothing is created or
// changed. The ceilings apply to creates (warm pools' specs included:
// over a ceiling, New fails), to renew's ttl_s and to a minted lease's
// ttl_s. Process limits are the provider's (docker's pids_limit option).
type Ceilings struct {
	MemoryMiB int64   // resources.memory_mib
	CPU       float64 // resources.cpu
	DiskGiB   float64 // resources.disk_gib
	// TTL bounds ttl_s. With a TTL ceiling, ttl_s 0 (no expiry) is
	// refused too, and so is a default TTL of no expiry (New fails).
	TTL time.Duration
	// EnvBytes and MetadataBytes bound env and metadata: the sum of the
	// lengths of their names and values.
	EnvBytes      int
	MetadataBytes int
	// FilesBytes bounds files: the sum of the lengths of the paths and
	// the contents. Files bounds its number of entries (each is one
	// write into the sandbox before create returns).
	FilesBytes int
	Files      int
}

// ceilingNote follows every "must be at most" of a ceiling, so a client
// knows the bound is the gateway's, not the schema's or the provider's.
const ceilingNote = "(the gateway's ceiling)"

// checkCreate adds a problem to bad for every field of r over a ceiling.
func (c Ceilings) checkCreate(r *CreateRequest, bad *providers.InvalidFields) {
	if r.TTL != nil {
		c.checkTTL("ttl_s", *r.TTL, bad)
	}
	c.checkResources(r.Resources, bad)
	if n := mapBytes(r.Env); c.EnvBytes > 0 && n > c.EnvBytes {
		bad.Add("env", "must be at most %d bytes %s, counting every name and value; it has %d", c.EnvBytes, ceilingNote, n)
	}
	if n := mapBytes(r.Metadata); c.MetadataBytes > 0 && n > c.MetadataBytes {
		bad.Add("metadata", "must be at most %d bytes %s, counting every key and value; it has %d", c.MetadataBytes, ceilingNote, n)
	}
	if n := mapBytes(r.Files); c.FilesBytes > 0 && n > c.FilesBytes {
		bad.Add("files", "must be at most %d bytes %s, counting every path and content; it has %d", c.FilesBytes, ceilingNote, n)
	}
	if n := len(r.Files); c.Files > 0 && n > c.Files {
		bad.Add("files", "must have at most %d entries %s; it has %d", c.Files, ceilingNote, n)
	}
}

// checkResources adds a problem to bad for every resource of r over a
// ceiling. A NaN is over every ceiling.
func (c Ceilings) checkResources(r providers.Resources, bad *providers.InvalidFields) {
	if v := r.MemoryMiB; v != nil && c.MemoryMiB > 0 && *v > c.MemoryMiB {
		bad.Add("resources.memory_mib", "must be at most %d %s", c.MemoryMiB, ceilingNote)
	}
	if v := r.CPU; v != nil && c.CPU > 0 && !(*v <= c.CPU) {
		bad.Add("resources.cpu", "must be at most %s %s", fmtFloat(c.CPU), ceilingNote)
	}
	if v := r.DiskGiB; v != nil && c.DiskGiB > 0 && !(*v <= c.DiskGiB) {
		bad.Add("resources.disk_gib", "must be at most %s %s", fmtFloat(c.DiskGiB), ceilingNote)
	}
}

// checkTTL adds a problem to bad when ttl, given as field, is over the
// TTL ceiling; 0 (no expiry) is over any. A negative ttl is left to the
// caller's own check.
func (c Ceilings) checkTTL(field string, ttl time.Duration, bad *providers.InvalidFields) {
	if c.TTL <= 0 || ttl < 0 {
		return
	}
	switch {
	case ttl == 0:
		bad.Add(field, "must be at most %s %s; 0 (no expiry) is over it", fmtSeconds(c.TTL), ceilingNote)
	case ttl > c.TTL:
		bad.Add(field, "must be at most %s %s", fmtSeconds(c.TTL), ceilingNote)
	}
}

// checkDefaults reports a default that would put a create that leaves the
// field out over its ceiling. defaultTTL 0 is no expiry.
func (c Ceilings) checkDefaults(defaultTTL time.Duration) error {
	if c.TTL > 0 && (defaultTTL == 0 || defaultTTL > c.TTL) {
		what := fmtSeconds(defaultTTL) + " s"
		if defaultTTL == 0 {
			what = "no expiry"
		}
		return fmt.Errorf("the default TTL (%s) is over the TTL ceiling of %s s: lower the default or raise the ceiling", what, fmtSeconds(c.TTL))
	}
	return nil
}

// mapBytes is the sum of the lengths of m's keys and values.
func mapBytes(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	return n
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func fmtSeconds(d time.Duration) string { return fmtFloat(d.Seconds()) }
