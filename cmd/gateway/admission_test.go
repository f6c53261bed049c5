package main

import (
	"io"
	"testing"

	"golang.org/x/sys/unix"
)

// The admission flags reach the service's options: quotas as given, the
// budget as host memory and the state dir filesystem times the
// overcommit factors, none on kubernetes; negative values are refused.
func TestAdmissionFlags(t *testing.T) {
	dir := t.TempDir()
	none := func(string) (string, bool) { return "", false }
	cfg, err := parseConfig([]string{"--state-dir", dir, "--overcommit", "2", "--disk-overcommit", "0.5",
		"--quota-sandboxes", "3", "--quota-memory-mib", "4096", "--quota-disk-gib", "1.5",
		"--quota-snapshots", "4", "--quota-snapshot-bytes", "2GiB", "--default-memory-mib", "512"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o, err := admissionOptions(cfg)
	if err != nil {
		t.Fatal(err)
	}
	q := o.Quotas
	if q.Sandboxes != 3 || q.MemoryMiB != 4096 || q.DiskMiB != 1536 || q.Snapshots != 4 || q.SnapshotBytes != 2<<30 {
		t.Fatalf("quotas %+v", q)
	}
	if o.DefaultMemoryMiB != 512 || o.DefaultDiskGiB != 10 {
		t.Fatalf("defaults committed: %d MiB, %v GiB", o.DefaultMemoryMiB, o.DefaultDiskGiB)
	}
	var si unix.Sysinfo_t
	var fs unix.Statfs_t
	if unix.Sysinfo(&si) != nil || unix.Statfs(dir, &fs) != nil {
		t.Fatal("cannot read the host's figures")
	}
	mem := int64(float64(si.Totalram) * float64(si.Unit) / (1 << 20) * 2)
	disk := int64(float64(fs.Blocks) * float64(fs.Bsize) / (1 << 20) * 0.5)
	if o.Budget.MemoryMiB != mem || o.Budget.DiskMiB != disk {
		t.Fatalf("budget %+v, want %d MiB memory, %d MiB disk", o.Budget, mem, disk)
	}

	cfg.Provider = "kubernetes"
	if o, err := admissionOptions(cfg); err != nil || o.Budget.MemoryMiB != 0 || o.Budget.DiskMiB != 0 || o.DefaultDiskGiB != 0 {
		t.Fatalf("kubernetes: %+v %v", o, err)
	}
	if _, err := parseConfig([]string{"--quota-sandboxes", "-1"}, none, io.Discard); err == nil {
		t.Fatal("a negative quota was accepted")
	}
}
