// Package hostfw keeps docker sandboxes off the host and off each other:
// the gateway's own iptables rules for the bridges of sandbox networks.
//
// Every sandbox network's bridge interface is named with one prefix
// (Config.Prefix, "sgbr-"), so two static rule chains cover every sandbox
// network there is or will be, with nothing to add or remove per network:
//
//	-A INPUT   -i sgbr-+ -j SANDGATE-INPUT
//	-A SANDGATE-INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
//	-A SANDGATE-INPUT -j DROP                    # no new connection to any host address
//	-A FORWARD -i sgbr-+ -j SANDGATE-FORWARD
//	-A SANDGATE-FORWARD -o sgbr-+ -j DROP        # nor to another sandbox network
//
// Replies to connections the host opened (a published port's docker-proxy
// connecting to the container) are established and pass. Docker's own
// DOCKER-ISOLATION chains drop traffic between bridge networks too; the
// FORWARD rule keeps that true when the daemon runs with --iptables=false.
// IPv4 only: docker disables IPv6 inside the containers of a network
// created without IPv6, as sandbox networks are.
//
// The rules are shared by every gateway on the host. A gateway holds a
// shared lock on Config.LockDir/<chain>.users from Open to Close; the last
// one to close, with no sandbox bridge left (sandboxes outlive their
// gateway by design, and stay isolated), removes the chains.
package hostfw

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Defaults for Config.
const (
	DefaultChain   = "SANDGATE"
	DefaultPrefix  = "sgbr-"
	DefaultLockDir = "/run/sandgate"
)

// Config names the rules. The zero value is the gateway's: every gateway
// on a host must use the same one; tests use their own so that they can
// check removal while other gateways run.
type Config struct {
	// Chain is the stem of the two chains (<Chain>-INPUT,
	// <Chain>-FORWARD), at most 20 characters. "" = DefaultChain.
	Chain string
	// Prefix starts the name of every sandbox bridge; 2 to 8 characters.
	// "" = DefaultPrefix.
	Prefix string
	// LockDir holds the lock files. "" = DefaultLockDir.
	LockDir string
}

func (c Config) withDefaults() (Config, error) {
	if c.Chain == "" {
		c.Chain = DefaultChain
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.LockDir == "" {
		c.LockDir = DefaultLockDir
	}
	if len(c.Chain) > 20 || len(c.Prefix) < 2 || len(c.Prefix) > 8 {
		return c, fmt.Errorf("hostfw: chain %q (at most 20 characters) or prefix %q (2 to 8) out of range", c.Chain, c.Prefix)
	}
	return c, nil
}

// BridgeName is the bridge interface name for the network keyed by key
// (unique per network): the prefix and a hash of key, 15 characters.
func (c Config) BridgeName(key string) string {
	c, _ = c.withDefaults()
	sum := sha256.Sum256([]byte(key))
	return c.Prefix + hex.EncodeToString(sum[:])[:15-len(c.Prefix)]
}

func (c Config) inputChain() string   { return c.Chain + "-INPUT" }
func (c Config) forwardChain() string { return c.Chain + "-FORWARD" }

// hooks are the jumps from the built-in chains, as iptables arguments
// after the chain name.
func (c Config) hooks() [][]string {
	return [][]string{
		{"INPUT", "-i", c.Prefix + "+", "-j", c.inputChain()},
		{"FORWARD", "-i", c.Prefix + "+", "-j", c.forwardChain()},
	}
}

// rules is the iptables-restore input that (re)writes both chains in one
// transaction: declaring a chain with --noflush empties it first, so no
// moment passes without the drop.
func (c Config) rules() string {
	return fmt.Sprintf(`*filter
:%[1]s - [0:0]
:%[2]s - [0:0]
-A %[1]s -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN
-A %[1]s -j DROP
-A %[2]s -o %[3]s+ -j DROP
COMMIT
`, c.inputChain(), c.forwardChain(), c.Prefix)
}

// Firewall is one gateway's hold on the rules. Close releases it.
type Firewall struct {
	cfg     Config
	ipt     tool
	users   *os.File // shared lock held until Close
	closeMu sync.Mutex
	closed  bool
}

// Open installs the rules (or finds them installed) and holds them until
// Close. It fails, saying why, where the gateway cannot install them: not
// root, no iptables, a lock directory it cannot write.
func Open(cfg Config) (*Firewall, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ipt, err := findTool()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.LockDir, 0o700); err != nil {
		return nil, fmt.Errorf("hostfw: %w", err)
	}
	users, err := lock(cfg.lockPath("users"), syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	// Gateways opening together: one writes at a time (the hook check and
	// insert is not atomic). A closing gateway cannot remove the rules
	// while anyone holds users.
	mu, err := lock(cfg.lockPath("mutate"), syscall.LOCK_EX)
	if err != nil {
		users.Close()
		return nil, err
	}
	err = install(ipt, cfg)
	mu.Close()
	if err != nil {
		users.Close()
		return nil, err
	}
	return &Firewall{cfg: cfg, ipt: ipt, users: users}, nil
}

// Config is the firewall's configuration, defaults filled in.
func (f *Firewall) Config() Config { return f.cfg }

// Tool names the iptables command the rules are written with (the one
// whose tables hold dockerd's chains).
func (f *Firewall) Tool() string { return f.ipt.name }

// Close releases this gateway's hold; if no other gateway holds the rules
// and no sandbox bridge is left, it removes them. Safe to call twice.
func (f *Firewall) Close() error {
	f.closeMu.Lock()
	defer f.closeMu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	f.users.Close()
	_, err := RemoveUnused(f.cfg)
	return err
}

// RemoveUnused removes the rules named by cfg when no gateway holds them
// and no bridge with cfg's prefix exists, and reports whether it did
// (false, nil: still in use). For clean-ups after a gateway that was
// killed.
func RemoveUnused(cfg Config) (bool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return false, err
	}
	users, err := lock(cfg.lockPath("users"), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil // no gateway ever installed them
	}
	if err != nil {
		return false, err
	}
	defer users.Close()
	if left, err := bridges(cfg.Prefix); err != nil || len(left) > 0 {
		return false, err
	}
	ipt, err := findTool()
	if err != nil {
		return false, err
	}
	return true, uninstall(ipt, cfg)
}

// Installed reports whether any of the rules named by cfg is present (a
// chain or a hook): after the last Close, none is.
func Installed(cfg Config) (bool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return false, err
	}
	ipt, err := findTool()
	if err != nil {
		return false, err
	}
	for _, c := range []string{cfg.inputChain(), cfg.forwardChain()} {
		if _, err := ipt.run("-S", c); err == nil {
			return true, nil
		}
	}
	for _, h := range cfg.hooks() {
		if _, err := ipt.run(append([]string{"-C"}, h...)...); err == nil {
			return true, nil
		}
	}
	return false, nil
}

func (c Config) lockPath(what string) string {
	return filepath.Join(c.LockDir, c.Chain+"."+what+".lock")
}

// lock opens path (creating it unless how is non-blocking exclusive, a
// probe) and flocks it; closing the file releases the lock.
func lock(path string, how int) (*os.File, error) {
	flags := os.O_RDWR | os.O_CREATE
	if how&syscall.LOCK_NB != 0 {
		flags = os.O_RDWR
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hostfw: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("hostfw: lock %s: %w", path, err)
	}
	return f, nil
}

// bridges lists the host's interfaces whose name starts with prefix.
func bridges(prefix string) ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("hostfw: %w", err)
	}
	var out []string
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, prefix) {
			out = append(out, i.Name)
		}
	}
	return out, nil
}

func install(ipt tool, cfg Config) error {
	if _, err := ipt.restore(cfg.rules()); err != nil {
		return err
	}
	for _, h := range cfg.hooks() {
		if _, err := ipt.run(append([]string{"-C"}, h...)...); err == nil {
			continue
		}
		// First, ahead of anything that accepts.
		if _, err := ipt.run(append([]string{"-I", h[0], "1"}, h[1:]...)...); err != nil {
			return err
		}
	}
	return nil
}

func uninstall(ipt tool, cfg Config) error {
	var errs []error
	for _, h := range cfg.hooks() {
		// A hook may be there twice (two gateways raced an older
		// install); delete until none is left.
		for range 16 {
			if _, err := ipt.run(append([]string{"-D"}, h...)...); err != nil {
				break
			}
		}
	}
	for _, c := range []string{cfg.inputChain(), cfg.forwardChain()} {
		if _, err := ipt.run("-F", c); err != nil && !noSuchChain(err) {
			errs = append(errs, err)
			continue
		}
		if _, err := ipt.run("-X", c); err != nil && !noSuchChain(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func noSuchChain(err error) bool {
	s := err.Error()
	return strings.Contains(s, "No chain/target/match") || strings.Contains(s, "does not exist")
}

// tool is an iptables command and its restore twin.
type tool struct{ name, restoreName string }

var (
	toolOnce sync.Once
	toolVal  tool
	toolErr  error
)

// findTool picks the iptables dockerd uses: of iptables-nft and
// iptables-legacy, the one whose filter table holds the DOCKER chain;
// plain iptables when neither (or only one) is installed or neither holds
// it. Rules in the other one would still be enforced (the kernel runs
// both), but would sit where no operator looks.
func findTool() (tool, error) {
	toolOnce.Do(func() {
		toolVal = tool{"iptables", "iptables-restore"}
		for _, v := range []string{"nft", "legacy"} {
			t := tool{"iptables-" + v, "iptables-" + v + "-restore"}
			if _, err := exec.LookPath(t.name); err != nil {
				continue
			}
			if _, err := t.run("-S", "DOCKER"); err == nil {
				toolVal = t
				break
			}
		}
		if _, err := exec.LookPath(toolVal.name); err != nil {
			toolErr = fmt.Errorf("hostfw: %s is not installed", toolVal.name)
			return
		}
		if _, err := exec.LookPath(toolVal.restoreName); err != nil {
			toolErr = fmt.Errorf("hostfw: %s is not installed", toolVal.restoreName)
		}
	})
	return toolVal, toolErr
}

func (t tool) run(args ...string) (string, error) {
	return t.exec(t.name, nil, append([]string{"-w", "-t", "filter"}, args...)...)
}

func (t tool) restore(input string) (string, error) {
	return t.exec(t.restoreName, strings.NewReader(input), "-w", "--noflush")
}

func (t tool) exec(name string, stdin *strings.Reader, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("hostfw: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
