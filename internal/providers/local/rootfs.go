package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// procReadOnly and procMasked follow runc's defaults. Sandbox root is host
// uid 0 (identity mapping), so plain file permissions would let it write
// /proc/sysrq-trigger or /proc/sys; the mounts, not the uid, protect them.
var (
	procReadOnly = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}
	procMasked   = []string{"acpi", "asound", "kcore", "keys", "latency_stats", "timer_list",
		"timer_stats", "sched_debug", "scsi"}
	devices = []string{"null", "zero", "full", "random", "urandom", "tty"}
)

// setupRoot builds the sandbox's root filesystem and pivots into it. It
// runs in init, inside the new user and mount namespaces:
//   - / is an overlay: the read-only clone of the host root that setup left
//     at <dir>/lower, with <dir>/upper taking every write (copy-on-write);
//   - fresh /proc with the sensitive parts read-only or masked, read-only
//     /sys, a tmpfs /dev with device binds and its own devpts, private
//     tmpfs /tmp and /dev/shm;
//   - the provider's state directory is covered by an empty read-only
//     tmpfs, so no sandbox sees another one's files;
//   - the workdir exists.
func setupRoot(cfg initConfig) error {
	root := cfg.Dir + "/root"
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// userxattr: overlay in a user namespace cannot use trusted.* xattrs;
	// without it, renaming or removing a lower directory fails with EIO.
	opts := fmt.Sprintf("lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work,userxattr", cfg.Dir, cfg.Dir, cfg.Dir)
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}

	if err := mountProc(root + "/proc"); err != nil {
		return err
	}
	// sysfs needs the sandbox's own netns, which it has; still best-effort
	// because nothing essential depends on it.
	if err := unix.Mount("sysfs", root+"/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		fmt.Fprintf(os.Stderr, "sandgate init: mount sysfs: %v\n", err)
	}
	if err := mountDev(root + "/dev"); err != nil {
		return err
	}
	if err := mountTmpfs(root+"/tmp", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := hideDir(root, cfg.StateDir); err != nil {
		return err
	}
	// pivot_root(".", ".") stacks the old root under the new one; the
	// detach then drops it without needing an old-root directory.
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("chdir to new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	// After the pivot, so that symlinks on the way resolve inside.
	if err := os.MkdirAll(cfg.Workdir, 0o755); err != nil {
		return fmt.Errorf("create workdir: %w", err)
	}
	if err := unix.Sethostname([]byte(cfg.ID)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := loopbackUp(); err != nil {
		return err
	}
	return nil
}

func mountProc(proc string) error {
	if err := os.MkdirAll(proc, 0o555); err != nil {
		return fmt.Errorf("create /proc: %w", err)
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, name := range procReadOnly {
		p := proc + "/" + name
		if _, err := os.Lstat(p); err != nil {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind /proc/%s: %w", name, err)
		}
		// The flags of the proc mount are locked in a user namespace: a
		// remount must repeat them or it fails with EPERM.
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount("", p, "", flags, ""); err != nil {
			return fmt.Errorf("make /proc/%s read-only: %w", name, err)
		}
	}
	for _, name := range procMasked {
		p := proc + "/" + name
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY, "size=0")
		} else {
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask /proc/%s: %w", name, err)
		}
	}
	return nil
}

func mountDev(dev string) error {
	if err := mountTmpfs(dev, unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	for _, name := range devices {
		p := dev + "/" + name
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o666)
		if err != nil {
			return fmt.Errorf("create /dev/%s: %w", name, err)
		}
		f.Close()
		if err := unix.Mount("/dev/"+name, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", name, err)
		}
	}
	links := [][2]string{
		{"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"},
		{"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"},
	}
	for _, l := range links {
		if err := os.Symlink(l[0], dev+"/"+l[1]); err != nil {
			return fmt.Errorf("link /dev/%s: %w", l[1], err)
		}
	}
	if err := os.Mkdir(dev+"/pts", 0o755); err != nil {
		return fmt.Errorf("create /dev/pts: %w", err)
	}
	// No gid= option: the tty group of the host is not necessarily mapped.
	if err := unix.Mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := os.Mkdir(dev+"/shm", 0o1777); err != nil {
		return fmt.Errorf("create /dev/shm: %w", err)
	}
	return mountTmpfs(dev+"/shm", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777")
}

func mountTmpfs(p string, flags uintptr, data string) error {
	if err := os.MkdirAll(p, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", flags, data); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", p, err)
	}
	return nil
}

// hideDir covers dir (a host path) inside root with an empty read-only
// tmpfs, if the sandbox would see it through the lower layer.
func hideDir(root, dir string) error {
	p := filepath.Join(root, dir)
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat state directory: %w", err)
	}
	if !fi.IsDir() {
		return nil
	}
	if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=755"); err != nil {
		return fmt.Errorf("hide state directory: %w", err)
	}
	return nil
}

// loopbackUp brings up lo, the only interface of the sandbox's netns.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	return nil
}
