package jail

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// procReadOnly and procMasked follow runc's defaults. Sandbox root is an
// unprivileged host uid, so the kernel already refuses it most of these;
// the mounts are a second wall.
var (
	procReadOnly = []string{"bus", "fs", "irq", "sys", "sysrq-trigger"}
	procMasked   = []string{"acpi", "asound", "kcore", "keys", "latency_stats", "timer_list",
		"timer_stats", "sched_debug", "scsi", "kallsyms"}
	devices = []string{"null", "zero", "full", "random", "urandom", "tty"}
)

// setupRoot builds the sandbox's root filesystem and pivots into it. It
// runs in init, inside the new user and mount namespaces, in the working
// directory setup left it (the sandbox's directory; see Config):
//   - / is an overlay: the read-only, id-mapped root image at lower/, under
//     the snapshot layers at layer<i>/ (a sandbox made from a snapshot),
//     with rw/upper taking every write (copy-on-write);
//   - the host directories of a host view (ro/<name>) are bound read-only
//     at /<name>, and the volumes (vol<i>) at their targets;
//   - fresh /proc with the sensitive parts read-only or masked and nested
//     user namespaces switched off, read-only /sys, a tmpfs /dev with
//     read-only device binds and its own devpts, a sized tmpfs /dev/shm;
//   - the provider's and the gateway's state directories, should the root
//     show them, are covered by an empty read-only tmpfs;
//   - the workdir exists.
func setupRoot(cfg Config) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// userxattr: overlay in a user namespace cannot use trusted.* xattrs;
	// without it, renaming or removing a lower directory fails with EIO.
	lower := "lower"
	for i := len(cfg.Layers) - 1; i >= 0; i-- {
		lower = fmt.Sprintf("layer%d/%s:%s", i, strings.TrimPrefix(upperDir, LayerDir+"/"), lower)
	}
	if err := unix.Mount("overlay", "root", "overlay", unix.MS_NODEV,
		"lowerdir="+lower+",upperdir=rw/"+upperDir+",workdir=rw/"+workDir+",userxattr"); err != nil {
		return fmt.Errorf("mount overlay root: %w", err)
	}
	for _, name := range cfg.Binds {
		dst := "root/" + name
		if err := unix.Mount("ro/"+name, dst, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /%s: %w", name, err)
		}
	}
	if err := bindVolumes(cfg, "root"); err != nil {
		return err
	}
	if err := mountProc("root/proc"); err != nil {
		return err
	}
	// sysfs needs the sandbox's own netns, which it has; still best-effort
	// because nothing essential depends on it.
	if err := os.MkdirAll("root/sys", 0o555); err == nil {
		if err := unix.Mount("sysfs", "root/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			fmt.Fprintf(os.Stderr, "sandgate init: mount sysfs: %v\n", err)
		}
	}
	if err := mountDev("root/dev", cfg.ShmBytes); err != nil {
		return err
	}
	if err := os.MkdirAll("root/tmp", 0o1777); err != nil {
		return fmt.Errorf("create /tmp: %w", err)
	}
	for _, d := range cfg.Private {
		if err := hideDir("root", d); err != nil {
			return err
		}
	}
	// pivot_root(".", ".") stacks the old root under the new one; the
	// detach then drops it without needing an old-root directory.
	if err := unix.Chdir("root"); err != nil {
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
	if err := unix.Sethostname([]byte(cmp.Or(cfg.Hostname, DefaultHostname))); err != nil {
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
	// The limit is per user namespace and binds every namespace below it:
	// no command can make a user namespace of its own, in which it would
	// be root again (and could mount, e.g. a cgroup hierarchy).
	if err := os.WriteFile(proc+"/sys/user/max_user_namespaces", []byte("0"), 0); err != nil {
		return fmt.Errorf("switch off nested user namespaces: %w", err)
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

func mountDev(dev string, shmBytes int64) error {
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
		// Read-only as runc binds them rootless: the node is the host's,
		// and its mode and owner must not change from inside.
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make /dev/%s read-only: %w", name, err)
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
	return mountTmpfs(dev+"/shm", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=1777,size=%d", shmBytes))
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
