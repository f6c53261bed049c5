package sandbox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/sandgate/sandgate/internal/providers"
)

// Sandbox groups: sandboxes of one group (one API key and one name) reach
// each other at their addresses (the provider's Grouper) and by name: the
// service keeps each member's /etc/hosts, written through the provider's
// file write (the in-sandbox agent, confined to the sandbox), whenever a
// member joins, leaves or is restored, or its hosts change.

const (
	// DefaultHostname is a sandbox's host name when its create names none.
	// It is no name in the group: every member without one has it.
	DefaultHostname = "sandbox"
	// MaxAliases bounds a create's aliases; MaxHosts a sandbox's hosts.
	MaxAliases = 16
	MaxHosts   = 256
	// hostsPath is the file the service manages.
	hostsPath = "/etc/hosts"
)

// labelPattern is a DNS label (RFC 1123), lower case.
var labelPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// checkLabel checks a DNS label (compared in lower case).
func checkLabel(s string) error {
	if !labelPattern.MatchString(s) {
		return fmt.Errorf("%q is not a DNS label: 1 to 63 of a-z, 0-9 and -, not starting or ending with -", s)
	}
	return nil
}

// checkHostName checks a host entry's name: dot-separated DNS labels, at
// most 253 characters.
func checkHostName(s string) error {
	if len(s) > 253 {
		return fmt.Errorf("%q is longer than 253 characters", s)
	}
	for _, l := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if !labelPattern.MatchString(l) {
			return fmt.Errorf("%q is not a host name: dot-separated labels of a-z, 0-9 and -", s)
		}
	}
	return nil
}

// capNames are the Linux capabilities (capabilities(7)), without CAP_.
var capNames = []string{
	"AUDIT_CONTROL", "AUDIT_READ", "AUDIT_WRITE", "BLOCK_SUSPEND", "BPF", "CHECKPOINT_RESTORE",
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "IPC_LOCK", "IPC_OWNER",
	"KILL", "LEASE", "LINUX_IMMUTABLE", "MAC_ADMIN", "MAC_OVERRIDE", "MKNOD", "NET_ADMIN",
	"NET_BIND_SERVICE", "NET_BROADCAST", "NET_RAW", "PERFMON", "SETFCAP", "SETGID", "SETPCAP",
	"SETUID", "SYS_ADMIN", "SYS_BOOT", "SYS_CHROOT", "SYS_MODULE", "SYS_NICE", "SYS_PACCT",
	"SYS_PTRACE", "SYS_RAWIO", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "SYSLOG", "WAKE_ALARM",
}

// NormalizeCap is a capability name as the service keeps it: upper case,
// without CAP_. ok is false for no capability of Linux.
func NormalizeCap(name string) (string, bool) {
	n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(name)), "CAP_")
	return n, slices.Contains(capNames, n)
}

// validateNet checks and normalises the create's group, names and cap_add
// against allow (the operator's --cap-add-allow), adding every problem to
// bad.
func (r *CreateRequest) validateNet(allow []string, bad *providers.InvalidFields) {
	if r.Group != "" {
		r.Group = strings.ToLower(r.Group)
		if err := checkLabel(r.Group); err != nil {
			bad.Add("group", "%s", err)
		}
	}
	if r.Hostname != "" {
		r.Hostname = strings.ToLower(r.Hostname)
		if err := checkLabel(r.Hostname); err != nil {
			bad.Add("hostname", "%s", err)
		}
	}
	if len(r.Aliases) > MaxAliases {
		bad.Add("aliases", "at most %d; it has %d", MaxAliases, len(r.Aliases))
	}
	if len(r.Aliases) > 0 && r.Group == "" {
		bad.Add("aliases", "aliases are names in a group: give group too")
	}
	seen := map[string]bool{r.Hostname: r.Hostname != ""}
	aliases := make([]string, 0, len(r.Aliases))
	for i, a := range r.Aliases {
		a = strings.ToLower(a)
		if err := checkLabel(a); err != nil {
			bad.Add(fmt.Sprintf("aliases[%d]", i), "%s", err)
		} else if seen[a] {
			bad.Add(fmt.Sprintf("aliases[%d]", i), "%q is given twice (as hostname or alias)", a)
		} else if a == DefaultHostname || a == "localhost" {
			bad.Add(fmt.Sprintf("aliases[%d]", i), "%q is every sandbox's own name", a)
		}
		seen[a] = true
		aliases = append(aliases, a)
	}
	r.Aliases = aliases
	caps := make([]string, 0, len(r.CapAdd))
	for i, c := range r.CapAdd {
		n, ok := NormalizeCap(c)
		switch {
		case !ok:
			bad.Add(fmt.Sprintf("cap_add[%d]", i), "%q is not a Linux capability (e.g. NET_ADMIN or CAP_NET_ADMIN)", c)
		case !slices.Contains(allow, n):
			allowed := "none (the operator allows capabilities with --cap-add-allow, e.g. --cap-add-allow NET_ADMIN)"
			if len(allow) > 0 {
				allowed = strings.Join(allow, ", ") + " (the gateway's --cap-add-allow)"
			}
			bad.Add(fmt.Sprintf("cap_add[%d]", i), "%s is not allowed here; allowed: %s", n, allowed)
		case !slices.Contains(caps, n):
			caps = append(caps, n)
		}
	}
	r.CapAdd = caps
}

// groupID is the opaque id of creator's group name: two keys' groups of
// one name never meet.
func groupID(creator, name string) string {
	h := sha256.Sum256([]byte("sandgate-group\x00" + creator + "\x00" + name))
	return "g" + hex.EncodeToString(h[:10])
}

// groupNames are the names a member is reached by in its group: its
// aliases, and its hostname unless it is the default.
func groupNames(hostname string, aliases []string) []string {
	out := slices.Clone(aliases)
	if hostname != "" && hostname != DefaultHostname {
		out = append(out, hostname)
	}
	return out
}

// reserveNames claims names in group gid for the create of id: ErrConflict
// naming each one a live member or a create in flight has. release gives
// them back (the created sandbox's record holds them from then on).
func (s *Service) reserveNames(gid, id string, names []string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	taken := map[string]string{}
	for _, b := range s.boxes {
		if b.rec.GroupID == gid && b.rec.State.Live() {
			for _, n := range groupNames(b.rec.Hostname, b.rec.Aliases) {
				taken[n] = b.rec.ID
			}
		}
	}
	var clash []string
	for _, n := range names {
		if taken[n] != "" || s.names[gid+"/"+n] != "" {
			clash = append(clash, n)
		}
	}
	if len(clash) > 0 {
		return nil, providers.Errorf(providers.ErrConflict, "name %s is taken in group: names are unique within a group", strings.Join(clash, ", "))
	}
	for _, n := range names {
		s.names[gid+"/"+n] = id
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, n := range names {
			delete(s.names, gid+"/"+n)
		}
	}, nil
}

// hostsFile is the /etc/hosts of rec: localhost, its own names, every
// other member's names at its address, then its own hosts entries.
func hostsFile(rec Record, members []Record) []byte {
	var b bytes.Buffer
	b.WriteString("# Written by sandgate: its group's names and the sandbox's hosts (PUT /v1/sandboxes/{id}/hosts).\n")
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	own := rec.Address
	if own == "" {
		own = "127.0.1.1"
	}
	fmt.Fprintf(&b, "%s\t%s\n", own, strings.Join(append([]string{cmpOr(rec.Hostname, DefaultHostname)}, rec.Aliases...), " "))
	for _, m := range members {
		if names := groupNames(m.Hostname, m.Aliases); m.ID != rec.ID && m.Address != "" && len(names) > 0 {
			fmt.Fprintf(&b, "%s\t%s\n", m.Address, strings.Join(names, " "))
		}
	}
	for _, name := range sortedKeys(rec.Hosts) {
		fmt.Fprintf(&b, "%s\t%s\n", rec.Hosts[name], name)
	}
	return b.Bytes()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// writeHosts writes the /etc/hosts of self (when not nil) and, with
// others, of every other live member of group gid (theirs name self, or no
// longer name a member gone). self need not be registered yet (a create
// writes its file before it returns). The write of self's file fails the
// call; the others' are logged (a member's file is written again at the
// next change).
func (s *Service) writeHosts(ctx context.Context, self *Record, gid string, others bool) error {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	var members []Record
	s.mu.Lock()
	for _, b := range s.boxes {
		if gid != "" && b.rec.GroupID == gid && b.rec.State.Live() && (self == nil || b.rec.ID != self.ID) {
			members = append(members, b.rec)
		}
	}
	s.mu.Unlock()
	if self != nil && gid != "" {
		members = append(members, *self)
	}
	sort.Slice(members, func(i, j int) bool { return members[i].CreatedAt.Before(members[j].CreatedAt) })
	if self != nil {
		if _, err := s.p.WriteFile(ctx, self.ID, hostsPath, bytes.NewReader(hostsFile(*self, members))); err != nil {
			return fmt.Errorf("write %s of %s: %w", hostsPath, self.ID, err)
		}
	}
	if !others {
		return nil
	}
	for _, m := range members {
		if (self != nil && m.ID == self.ID) || m.State != providers.StateRunning {
			continue // a paused member's agent is frozen: it gets the next change's
		}
		if _, err := s.p.WriteFile(ctx, m.ID, hostsPath, bytes.NewReader(hostsFile(m, members))); err != nil {
			s.log.Warn("write a group member's hosts", "sandbox", m.ID, "err", err)
		}
	}
	return nil
}

// joinGroup connects the just-made sandbox id to gid and returns its
// address.
func (s *Service) joinGroup(ctx context.Context, id, gid string) (string, error) {
	addr, err := s.p.(providers.Grouper).JoinGroup(ctx, id, gid)
	if err != nil {
		return "", fmt.Errorf("join group: %w", err)
	}
	return addr.String(), nil
}

// ParseHosts checks a hosts body (name → address) and returns it with
// names in lower case, or every problem at once.
func ParseHosts(in map[string]any) (map[string]string, error) {
	var bad providers.InvalidFields
	if len(in) > MaxHosts {
		bad.Add("hosts", "at most %d entries; it has %d", MaxHosts, len(in))
	}
	out := make(map[string]string, len(in))
	for _, name := range sortedKeys(in) {
		field := "hosts." + name
		v, ok := in[name].(string)
		if !ok {
			bad.Add(field, "the address must be a string (an IPv4 or IPv6 address)")
			continue
		}
		lname := strings.ToLower(name)
		if err := checkHostName(lname); err != nil {
			bad.Add(field, "%s", err)
			continue
		}
		a, err := netip.ParseAddr(v)
		if err != nil || a.Zone() != "" {
			bad.Add(field, "%q is not an IP address", v)
			continue
		}
		if _, dup := out[lname]; dup {
			bad.Add(field, "%q is given twice (names are compared in lower case)", lname)
		}
		out[lname] = a.String()
	}
	if err := bad.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// SetHosts replaces sandbox id's own host entries (owner scope; hosts as
// ParseHosts returns them) and rewrites its /etc/hosts before it returns.
func (s *Service) SetHosts(ctx context.Context, c Caller, id string, hosts map[string]string) (Info, error) {
	a, err := s.authorize(ctx, c, id, ScopeOwner)
	if err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	state, rec := a.box.rec.State, a.box.rec
	s.mu.Unlock()
	if state != providers.StateRunning {
		return Info{}, providers.Errorf(providers.ErrConflict, "sandbox %s is %s", id, state)
	}
	rec.Hosts = hosts
	if err := s.writeHosts(ctx, &rec, rec.GroupID, false); err != nil {
		return Info{}, err
	}
	if err := s.st.PutRecord(ctx, rec, nil); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	a.box.rec.Hosts = hosts
	s.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return a.box.info(), nil
}

// restoreGroups connects the live members found at start to their groups
// again (a gateway restart loses the provider's connections, e.g. the
// local egress point) and rewrites their /etc/hosts, since an address may
// have changed. A failure is logged: that member is cut off until it is
// created again.
func (s *Service) restoreGroups(ctx context.Context) {
	g, ok := s.p.(providers.Grouper)
	if !ok {
		return
	}
	groups := map[string]bool{}
	for id, b := range s.boxes {
		if b.rec.GroupID == "" || !b.rec.State.Live() {
			continue
		}
		addr, err := g.JoinGroup(ctx, id, b.rec.GroupID)
		if err != nil {
			s.log.Warn("restore group membership", "sandbox", id, "err", err)
			continue
		}
		if a := addr.String(); a != b.rec.Address {
			b.rec.Address = a
			if err := s.st.PutRecord(ctx, b.rec, nil); err != nil {
				s.log.Warn("restore group membership", "sandbox", id, "err", err)
			}
		}
		groups[b.rec.GroupID] = true
	}
	for gid := range groups {
		_ = s.writeHosts(ctx, nil, gid, true)
	}
}

// stringList is v as a list of strings (a JSON array decoded into any).
func stringList(v any) ([]string, bool) {
	switch x := v.(type) {
	case []string:
		return x, true
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, false
			}
			out = append(out, s)
		}
		return out, true
	}
	return nil, false
}
