package sandbox

import (
	"math"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// Any string given as a token: verify never panics, and what it accepts
// is exactly what mint makes of the claims it returns (one spelling per
// token). Minted claims (ids without the separator) round-trip, and a
// minted token with one byte changed never verifies.
func FuzzLeaseToken(f *testing.F) {
	s := signer{secret: []byte("fuzz-secret-0123456789abcdef0123")}
	good := s.mint(claims{SandboxID: "sbx-abc", LeaseID: "ls-1", Scope: ScopeOwner, Expires: time.Unix(1_900_000_000, 0)})
	for _, seed := range []string{good, "", tokenPrefix, tokenPrefix + ".", tokenPrefix + "YQ.YQ", good + "=", strings.ToUpper(good), good[:len(good)-1]} {
		f.Add(seed, "sbx-x", "ls-y", "operate", int64(0), 0, byte(1))
	}
	f.Fuzz(func(t *testing.T, tok, sid, lid, scope string, exp int64, at int, flip byte) {
		if c, err := s.verify(tok); err == nil && s.mint(c) != tok {
			t.Fatalf("verify accepted %q, which mint spells %q", tok, s.mint(c))
		}
		if strings.Contains(sid+lid, "|") || !Scope(scope).Valid() {
			return
		}
		if exp < 0 || exp > 1<<40 {
			exp = 0
		}
		c := claims{SandboxID: sid, LeaseID: lid, Scope: Scope(scope)}
		if exp != 0 {
			c.Expires = time.Unix(exp, 0)
		}
		minted := s.mint(c)
		back, err := s.verify(minted)
		if err != nil || back.SandboxID != sid || back.LeaseID != lid || back.Scope != c.Scope || !back.Expires.Equal(c.Expires) {
			t.Fatalf("round trip of %+v: %+v, %v", c, back, err)
		}
		if flip == 0 {
			return
		}
		b := []byte(minted)
		i := len(tokenPrefix) + (at%len(b)+len(b))%(len(b)-len(tokenPrefix))
		b[i] ^= flip
		if _, err := s.verify(string(b)); err == nil {
			t.Fatalf("a changed token verified: %q", b)
		}
	})
}

// A file path a request may give: what checkPath accepts resolves to a
// clean absolute path with no ".." step, under the workdir when relative.
func FuzzFilePath(f *testing.F) {
	for _, p := range []string{"a.txt", "/etc/passwd", "../x", "a/../../b", "a/./b", "//x", "a\x00b", "", "..", ".../x", "a/..", "./../", "/"} {
		f.Add("/workspace", p)
	}
	f.Fuzz(func(t *testing.T, workdir, p string) {
		if !path.IsAbs(workdir) || path.Clean(workdir) != workdir || checkPath(workdir) != nil {
			return
		}
		if checkPath(p) != nil {
			return
		}
		r := resolve(workdir, p)
		if !path.IsAbs(r) || path.Clean(r) != r {
			t.Fatalf("resolve(%q, %q) = %q: not clean and absolute", workdir, p, r)
		}
		for _, el := range strings.Split(r, "/") {
			if el == ".." {
				t.Fatalf("resolve(%q, %q) = %q steps up", workdir, p, r)
			}
		}
		if !path.IsAbs(p) && r != workdir && !strings.HasPrefix(r, strings.TrimSuffix(workdir, "/")+"/") {
			t.Fatalf("relative %q resolved out of the workdir %q: %q", p, workdir, r)
		}
	})
}

// A create request's provider-neutral fields: validate never panics, and
// what it accepts has a clean absolute workdir, valid env names, file
// paths that pass checkPath, unique ports in range, and nothing over
// fuzzCeilings (ttl 0, no expiry, included).
func FuzzCreateValidation(f *testing.F) {
	f.Add("/work", "A", "f.txt", 80, 80, int64(512), 1.0, 10.0, 60.0, 10)
	f.Add("rel", "A=B", "../x", 0, 65536, int64(1e8), 1000.0, 5000.0, 1e9, 40<<20)
	f.Add("", "", "", 1, 2, int64(1024), 2.0, 10.0, 3600.0, 63)
	f.Add("/a/../b", "\x00", "/abs", -1, 70000, int64(1025), 2.001, 10.5, 3601.0, 64)
	f.Add("/w", "B", "g", 5, 6, int64(0), math.NaN(), math.Inf(1), 0.0, 0)
	f.Fuzz(func(t *testing.T, workdir, envKey, file string, p1, p2 int, mem int64, cpu, disk, ttlS float64, metaBytes int) {
		ttl := time.Duration(ttlS * float64(time.Second))
		meta := map[string]string{}
		if metaBytes > 0 && metaBytes <= 1<<20 {
			meta["k"] = strings.Repeat("v", metaBytes-1)
		}
		r := CreateRequest{Workdir: workdir, Env: map[string]string{envKey: "v"}, Files: map[string]string{file: "x"}, Ports: []int{p1, p2},
			TTL: &ttl, Metadata: meta, Resources: providers.Resources{MemoryMiB: &mem, CPU: &cpu, DiskGiB: &disk}}
		if r.validate(fuzzCeilings, nil) != nil {
			return
		}
		if !path.IsAbs(r.Workdir) || path.Clean(r.Workdir) != r.Workdir {
			t.Fatalf("workdir %q accepted as %q", workdir, r.Workdir)
		}
		if envKey == "" || strings.ContainsAny(envKey, "=\x00") {
			t.Fatalf("env name %q accepted", envKey)
		}
		if checkPath(file) != nil {
			t.Fatalf("file path %q accepted", file)
		}
		if p1 < 1 || p1 > 65535 || p2 < 1 || p2 > 65535 || p1 == p2 {
			t.Fatalf("ports %d, %d accepted", p1, p2)
		}
		c := fuzzCeilings
		if mem > c.MemoryMiB || !(cpu <= c.CPU) || !(disk <= c.DiskGiB) || ttl == 0 || ttl > c.TTL || len(meta["k"])+len(meta) > c.MetadataBytes {
			t.Fatalf("over a ceiling, accepted: memory %d cpu %g disk %g ttl %v metadata %d bytes", mem, cpu, disk, ttl, len(meta["k"])+len(meta))
		}
	})
}

var fuzzCeilings = Ceilings{MemoryMiB: 1024, CPU: 2, DiskGiB: 10, TTL: time.Hour, EnvBytes: 64, MetadataBytes: 64, FilesBytes: 64, Files: 4}
