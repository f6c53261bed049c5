package sandbox

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const tokenPrefix = "sgl1."

// claims is what a token says; the MAC makes it unforgeable, the store makes
// it revocable.
type claims struct {
	SandboxID string
	LeaseID   string
	Scope     Scope
	Expires   time.Time // zero: no expiry of its own
}

var lower32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// randomID returns n lowercase base32 characters from crypto/rand.
func randomID(n int) string {
	b := make([]byte, (n*5+7)/8)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return strings.ToLower(lower32.EncodeToString(b))[:n]
}

func newSandboxID() string  { return "sbx-" + randomID(20) }
func newLeaseID() string    { return "ls-" + randomID(16) }
func newSnapshotID() string { return "snp-" + randomID(20) }

// signer mints and verifies lease tokens: tokenPrefix + base64url(payload)
// + "." + base64url(HMAC-SHA256(secret, payload)).
type signer struct{ secret []byte }

func (s signer) mint(c claims) string {
	var exp int64
	if !c.Expires.IsZero() {
		exp = c.Expires.Unix()
	}
	payload := c.SandboxID + "|" + c.LeaseID + "|" + string(c.Scope) + "|" + strconv.FormatInt(exp, 10)
	return tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." +
		base64.RawURLEncoding.EncodeToString(s.mac([]byte(payload)))
}

func (s signer) mac(payload []byte) []byte {
	h := hmac.New(sha256.New, s.secret)
	h.Write(payload)
	return h.Sum(nil)
}

var strictB64 = base64.RawURLEncoding.Strict()

var errBadToken = errors.New("malformed or forged token")

// verify checks a token's form and MAC (in constant time) and returns its
// claims. It does not check expiry or revocation.
func (s signer) verify(tok string) (claims, error) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return claims{}, errBadToken
	}
	p64, m64, ok := strings.Cut(rest, ".")
	if !ok {
		return claims{}, errBadToken
	}
	// Strict: a token has exactly one spelling (no slack in the final
	// character's unused bits). The decoder skips CR and LF even so (found
	// by FuzzLeaseToken): a token must be its own canonical encoding.
	payload, err1 := strictB64.DecodeString(p64)
	mac, err2 := strictB64.DecodeString(m64)
	if err1 != nil || err2 != nil || strictB64.EncodeToString(payload) != p64 || strictB64.EncodeToString(mac) != m64 ||
		!hmac.Equal(mac, s.mac(payload)) {
		return claims{}, errBadToken
	}
	f := strings.Split(string(payload), "|")
	if len(f) != 4 {
		return claims{}, errBadToken
	}
	exp, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || !Scope(f[2]).Valid() {
		return claims{}, errBadToken
	}
	c := claims{SandboxID: f[0], LeaseID: f[1], Scope: Scope(f[2])}
	if exp != 0 {
		c.Expires = time.Unix(exp, 0)
	}
	return c, nil
}

// loadSecret returns the configured secret, or the one persisted in dir,
// creating it (32 random bytes, mode 0600) on first use.
func loadSecret(configured, dir string) ([]byte, error) {
	if configured != "" {
		if len(configured) < 16 {
			return nil, errors.New("lease secret must be at least 16 characters")
		}
		return []byte(configured), nil
	}
	path := filepath.Join(dir, "lease.key")
	b, err := os.ReadFile(path)
	if err == nil {
		secret, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(secret) < 16 {
			return nil, fmt.Errorf("lease secret file %s is corrupt", path)
		}
		return secret, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read lease secret: %w", err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("write lease secret: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("write lease secret: %w", err)
	}
	return secret, nil
}

// keyFingerprint identifies an API key without storing it.
func keyFingerprint(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}
