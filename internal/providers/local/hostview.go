package local

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// The host view: the root filesystem of a sandbox made without an image.
// It is what a user expects of a Linux machine (bash, coreutils, python:
// whatever the host has installed) without anything that is the host's
// own business. Its lower layer is a skeleton directory, built by New
// under <state>/views:
//   - the top-level system directories (/usr, /opt and, on a host without
//     merged /usr, /bin, /sbin, /lib*) are empty mount points; the
//     sandbox gets the host's, bound read-only and id-mapped;
//   - the top-level symlinks of a merged-/usr host (/bin -> usr/bin, …)
//     are recreated;
//   - /etc holds copies of an allow-list of the host's /etc, and of those
//     only what every host user may read (no shadow, gshadow, ssh host
//     keys, sudoers, private TLS keys, credentials);
//   - /root, /home, /var, /srv, /run, /tmp, /mnt, /media are empty;
//     nothing else of the host is there.
// Every write lands in the sandbox's upper layer.

// viewSystemDirs are bound from the host when they are directories there.
var viewSystemDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"}

// viewEmptyDirs are created empty, with their usual modes.
var viewEmptyDirs = []struct {
	name string
	mode os.FileMode
}{
	{"root", 0o700}, {"home", 0o755}, {"tmp", 0o1777}, {"var", 0o755}, {"var/tmp", 0o1777},
	{"var/log", 0o755}, {"var/cache", 0o755}, {"var/lib", 0o755}, {"run", 0o755}, {"srv", 0o755},
	{"mnt", 0o755}, {"media", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
}

// etcAllow lists the entries of the host's /etc a sandbox gets (a trailing
// * matches a prefix). Directories are copied whole, minus what only root
// may read.
var etcAllow = []string{
	"passwd", "group", "hosts", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
	"networks", "protocols", "services", "rpc", "ethertypes", "ld.so.conf", "ld.so.conf.d",
	"ld.so.cache", "localtime", "timezone", "os-release", "debian_version", "lsb-release",
	"issue", "profile", "profile.d", "bash.bashrc", "bash_completion.d", "environment", "shells",
	"login.defs", "skel", "inputrc", "mime.types", "magic", "magic.mime", "ssl", "ca-certificates",
	"ca-certificates.conf", "alternatives", "locale.alias", "locale.gen", "locale.conf",
	"terminfo", "python3*", "perl", "vim", "wgetrc", "xattr.conf", "manpath.config", "mtab",
	"adduser.conf", "deluser.conf", "pam.conf", "pam.d", "security", "java-*", "maven",
	"fonts", "pip.conf", "mailcap", "mke2fs.conf", "e2scrub.conf", "bindresvport.blacklist",
}

// etcDeny is never copied, whatever its mode (paths relative to /etc).
var etcDeny = []string{"ssl/private", "security/opasswd", "shadow", "gshadow", "sudoers", "sudoers.d"}

func etcAllowed(name string) bool {
	for _, a := range etcAllow {
		if p, ok := strings.CutSuffix(a, "*"); ok && strings.HasPrefix(name, p) || a == name {
			return true
		}
	}
	return false
}

// hostView is a built skeleton and the host directories to bind into it.
type hostView struct {
	dir   string   // the skeleton, lower layer of the root overlay
	binds []string // top-level names to bind read-only from the host
}

// buildView makes a new skeleton under viewsDir from the host's current
// state and returns it.
func buildView(viewsDir string) (hostView, error) {
	dir := filepath.Join(viewsDir, "v-"+randHex())
	v := hostView{dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return v, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return v, err
	}
	for _, name := range viewSystemDirs {
		fi, err := os.Lstat("/" + name)
		switch {
		case err != nil:
			continue
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink("/" + name)
			if err != nil {
				return v, err
			}
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				return v, err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
				return v, err
			}
			v.binds = append(v.binds, name)
		}
	}
	for _, d := range viewEmptyDirs {
		p := filepath.Join(dir, d.name)
		if err := os.Mkdir(p, d.mode); err != nil {
			return v, err
		}
		if err := os.Chmod(p, d.mode); err != nil { // past the umask
			return v, err
		}
	}
	if err := copyEtc("/etc", filepath.Join(dir, "etc")); err != nil {
		return v, fmt.Errorf("copy /etc: %w", err)
	}
	return v, nil
}

// copyEtc copies the allowed, world-readable part of src to dst.
func copyEtc(src, dst string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !etcAllowed(e.Name()) {
			continue
		}
		err := filepath.WalkDir(filepath.Join(src, e.Name()), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if d != nil && d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			rel, _ := filepath.Rel(src, p)
			if slices.Contains(etcDeny, rel) {
				if d.IsDir() {
					return fs.SkipDir
				}
				return nil
			}
			skip, err := copyEntry(p, filepath.Join(dst, rel))
			if skip && d.IsDir() {
				return fs.SkipDir
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// copyEntry copies one directory (without its contents), symlink or
// regular file, keeping mode and ownership. Anything that not every user
// may read is left out (skip reports that): what is private on the host
// stays there.
func copyEntry(src, dst string) (skip bool, err error) {
	fi, err := os.Lstat(src)
	if err != nil {
		return true, nil
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	mode := fi.Mode()
	switch {
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return true, nil
		}
		err = os.Symlink(target, dst)
		if err == nil && st != nil {
			err = os.Lchown(dst, int(st.Uid), int(st.Gid))
		}
		return false, err
	case mode.IsDir():
		if mode.Perm()&0o005 != 0o005 {
			return true, nil
		}
		if err := os.Mkdir(dst, mode.Perm()); err != nil {
			return false, err
		}
	case mode.IsRegular():
		if mode.Perm()&0o004 == 0 {
			return true, nil
		}
		if err := copyFile(src, dst, mode.Perm()); err != nil {
			return false, err
		}
	default:
		return true, nil
	}
	if st != nil {
		if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return false, err
		}
	}
	return false, os.Chmod(dst, mode.Perm()|mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return nil // vanished or unreadable: left out
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// pruneViews removes the skeletons under viewsDir that no sandbox uses
// (inUse holds the current one too), best effort: one left behind is
// removed by the next start.
func pruneViews(viewsDir string, inUse map[string]bool) {
	entries, _ := os.ReadDir(viewsDir)
	for _, e := range entries {
		if p := filepath.Join(viewsDir, e.Name()); !inUse[p] {
			os.RemoveAll(p)
		}
	}
}
