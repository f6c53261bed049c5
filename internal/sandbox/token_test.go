package sandbox

import (
	"strings"
	"testing"
	"time"
)

// TestTokenHasOneSpelling: changing any one character of a token, the
// MAC's last character included, makes it fail to verify.
func TestTokenHasOneSpelling(t *testing.T) {
	s := signer{secret: []byte("0123456789abcdef0123456789abcdef")}
	c := claims{SandboxID: newSandboxID(), LeaseID: newLeaseID(), Scope: ScopeOperate, Expires: time.Unix(1_900_000_000, 0)}
	tok := s.mint(c)
	got, err := s.verify(tok)
	if err != nil || got != c {
		t.Fatalf("round trip: %v %+v", err, got)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.|"
	for i := range len(tok) {
		for _, r := range alphabet {
			if byte(r) == tok[i] {
				continue
			}
			bad := tok[:i] + string(r) + tok[i+1:]
			if _, err := s.verify(bad); err == nil {
				t.Fatalf("token with char %d changed to %q verified", i, r)
			}
		}
	}
	other := signer{secret: []byte("another-secret-another-secret!!")}
	if _, err := other.verify(tok); err == nil {
		t.Fatal("token verified under another secret")
	}
}

func TestSandboxIDForm(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := newSandboxID()
		if len(id) != 24 || id[:4] != "sbx-" {
			t.Fatalf("id %q", id)
		}
		for _, r := range id[4:] {
			if !(r >= 'a' && r <= 'z' || r >= '2' && r <= '7') {
				t.Fatalf("id %q has %q outside lowercase base32", id, r)
			}
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}

// The base64 decoder skips CR and LF: a token with one inserted is another
// spelling of a valid token and must not verify (found by FuzzLeaseToken).
func TestTokenOneSpelling(t *testing.T) {
	s := signer{secret: []byte("0123456789abcdef0123456789abcdef")}
	tok := s.mint(claims{SandboxID: "sbx-a", LeaseID: "ls-b", Scope: ScopeOperate})
	if _, err := s.verify(tok); err != nil {
		t.Fatal(err)
	}
	dot := strings.IndexByte(tok, '.')
	for _, bad := range []string{tok[:dot-2] + "\n" + tok[dot-2:], tok[:dot+3] + "\r" + tok[dot+3:], tok + "\n"} {
		if _, err := s.verify(bad); err == nil {
			t.Errorf("%q verified", bad)
		}
	}
}
