package sandbox

import (
	"context"
	"strings"
	"time"
)

// Authenticate verifies c before anything of its request is read: on a
// sandbox's routes (id != "") the credential must hold for sandbox id at
// the lowest scope, with the answers of authorize in their order (401 for
// a missing, forged, expired or revoked credential, 403 for another
// sandbox's, 404 for an unknown sandbox only after that); on the others
// (id == "": create, list, snapshots) it must be a known API key, or none
// where anonymous callers are allowed. The route's own scope is checked
// later, by the method it calls.
//
// It returns c marked as verified for id: the methods the request then
// calls on sandbox id do not read a SharedStore again within freshFor
// (one store read per call, as before). It also returns the fingerprint
// of the API key the request counts against: the caller's own key, or on
// a sandbox's routes the key that created the sandbox ("" = anonymous).
func (s *Service) Authenticate(ctx context.Context, c Caller, id string) (Caller, string, error) {
	if id == "" {
		key, err := s.authorizeKey(c)
		return c, key, err
	}
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return c, "", err
	}
	s.mu.Lock()
	key := a.box.rec.Creator
	s.mu.Unlock()
	c.fresh, c.freshAt = id, s.opts.Clock.Now()
	return c, key, nil
}

// freshFor is how long after Authenticate read a SharedStore for a
// request the calls of that request trust what it read.
const freshFor = time.Second

// refreshFor is refreshShared(id), skipped when c was authenticated for
// id within freshFor.
func (s *Service) refreshFor(ctx context.Context, c Caller, id string) error {
	if c.fresh == id && s.opts.Clock.Now().Sub(c.freshAt) < freshFor {
		return nil
	}
	return s.refreshShared(ctx, id)
}

// IsCredential reports whether tok is a credential of this gateway: a
// configured API key or a lease token bearing its MAC, whether or not the
// lease is still live. What carries one must not leave the gateway (the
// proxy strips it).
func (s *Service) IsCredential(tok string) bool {
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return false
	}
	if strings.HasPrefix(tok, tokenPrefix) {
		_, err := s.sign.verify(tok)
		return err == nil
	}
	_, ok := s.apiKey(tok)
	return ok
}
