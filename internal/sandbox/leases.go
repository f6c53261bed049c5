package sandbox

import (
	"context"
	"crypto/subtle"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/providers"
)

// authorize checks c for sandbox id and scope need: 401 for missing, bad,
// expired or revoked credentials, 403 for another sandbox's token or too
// low a scope, 404 for an unknown sandbox (only after the token verified).
//
// A lease token only names a lease: its sandbox, scope and expiry are
// those of the Lease in the store. The MAC proves the token came from
// someone holding the secret, not that its claims are true; a token whose
// claims differ from the lease it names (say, owner scope for an operate
// lease, or a later expiry) was never minted by this gateway and is
// refused with 401, as is one naming another sandbox's lease.
// Caller must not hold s.mu.
func (s *Service) authorize(ctx context.Context, c Caller, id string, need Scope) (access, error) {
	tok := c.Lease
	if tok == "" {
		tok = c.Bearer
	}
	if tok == "" {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "a lease token or API key is required")
	}
	if !strings.HasPrefix(tok, tokenPrefix) {
		fp, ok := s.apiKey(tok)
		if !ok {
			return access{}, providers.Errorf(providers.ErrUnauthorized, "invalid credentials")
		}
		if err := s.refreshFor(ctx, c, id); err != nil {
			return access{}, err
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		b := s.boxes[id]
		if b == nil {
			return access{}, errSandboxNotFound(id)
		}
		if b.rec.Creator != fp {
			return access{}, providers.Errorf(providers.ErrForbidden, "this API key did not create sandbox %s", id)
		}
		return access{box: b, scope: ScopeOwner}, nil
	}
	cl, err := s.sign.verify(tok)
	if err != nil {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "invalid lease token")
	}
	// These two use the claims only to keep the order of the answers (an
	// expired or misdirected token says so before the sandbox's existence
	// is revealed); the stored lease decides below.
	now := s.opts.Clock.Now()
	if !cl.Expires.IsZero() && !now.Before(cl.Expires) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token expired")
	}
	if cl.SandboxID != id {
		return access{}, providers.Errorf(providers.ErrForbidden, "lease token is for another sandbox")
	}
	if err := s.refreshFor(ctx, c, id); err != nil {
		return access{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.boxes[id]
	if b == nil {
		return access{}, errSandboxNotFound(id)
	}
	l, ok := s.leases[cl.LeaseID]
	if !ok {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token was revoked")
	}
	if l.SandboxID != cl.SandboxID || l.Scope != cl.Scope || !sameSecond(l.ExpiresAt, cl.Expires) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "invalid lease token")
	}
	if !l.ExpiresAt.IsZero() && !now.Before(l.ExpiresAt) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token expired")
	}
	if !s.liveLocked(l, now) {
		return access{}, providers.Errorf(providers.ErrUnauthorized, "lease token was revoked")
	}
	if !l.Scope.Covers(need) {
		return access{}, providers.Errorf(providers.ErrForbidden, "this needs a lease of scope %s", need)
	}
	return access{box: b, scope: l.Scope, leaseID: l.ID, expires: l.ExpiresAt}, nil
}

// sameSecond reports whether a and b are the same expiry as a token
// carries it: both none, or the same Unix second.
func sameSecond(a, b time.Time) bool {
	if a.IsZero() || b.IsZero() {
		return a.IsZero() == b.IsZero()
	}
	return a.Unix() == b.Unix()
}

// apiKey reports whether tok is a configured API key, and its fingerprint.
func (s *Service) apiKey(tok string) (string, bool) {
	fp := keyFingerprint(tok)
	ok := false
	for k := range s.keys {
		// Every key is compared so the time taken does not say which matched.
		if subtle.ConstantTimeCompare([]byte(k), []byte(fp)) == 1 {
			ok = true
		}
	}
	return fp, ok
}

// liveLocked reports whether l is live at now: unexpired, and every lease
// above it (up to its root) in memory and unexpired. Revoking a lease
// removes its subtree from the store, but a replica may mint under a lease
// of that subtree while the removal is under way; the child it stores then
// has a missing parent and is refused here, like the rest of the subtree.
// Caller holds mu.
func (s *Service) liveLocked(l Lease, now time.Time) bool {
	// Bounded by the number of leases: a parent chain read from a store
	// written by others must not loop forever even if it were a cycle.
	for range len(s.leases) + 1 {
		if !l.ExpiresAt.IsZero() && !now.Before(l.ExpiresAt) {
			return false
		}
		if l.Parent == "" {
			return true
		}
		p, ok := s.leases[l.Parent]
		if !ok || p.SandboxID != l.SandboxID {
			return false
		}
		l = p
	}
	return false
}

// authorizeKey checks the credentials for create and list and returns the
// creator fingerprint ("" for an anonymous caller).
func (s *Service) authorizeKey(c Caller) (string, error) {
	if c.Bearer == "" {
		if s.opts.AllowAnonymous && len(s.keys) == 0 {
			return "", nil
		}
		return "", providers.Errorf(providers.ErrUnauthorized, "an API key is required (Authorization: Bearer <key>)")
	}
	if len(s.keys) == 0 && s.opts.AllowAnonymous {
		return "", nil
	}
	fp, ok := s.apiKey(c.Bearer)
	if !ok {
		return "", providers.Errorf(providers.ErrUnauthorized, "invalid API key")
	}
	return fp, nil
}

// Mint returns a new lease for the sandbox. An operate caller can mint only
// operate leases. ttl nil: the lease lives as long as the sandbox; a ttl
// over the TTL ceiling is ErrInvalid.
//
// A lease never outlives the lease that mints it: when the caller's lease
// expires, ttl nil means the caller's expiry, and a ttl that would end
// after it is refused (ErrInvalid on ttl_s, naming the time the caller's
// lease has left) rather than silently shortened. An API key has no
// expiry of its own and mints any ttl.
func (s *Service) Mint(ctx context.Context, c Caller, id string, scope Scope, ttl *time.Duration) (Ref, error) {
	if scope == "" {
		scope = ScopeOperate
	}
	if !scope.Valid() {
		return Ref{}, providers.InvalidFields{{Field: "scope", Message: "must be owner or operate"}}
	}
	if ttl != nil && *ttl <= 0 {
		return Ref{}, providers.InvalidFields{{Field: "ttl_s", Message: "must be positive"}}
	}
	if ttl != nil {
		var bad providers.InvalidFields
		s.opts.Ceilings.checkTTL("ttl_s", *ttl, &bad)
		if err := bad.Err(); err != nil {
			return Ref{}, err
		}
	}
	a, err := s.authorize(ctx, c, id, scope)
	if err != nil {
		return Ref{}, err
	}
	now := s.opts.Clock.Now()
	l := Lease{ID: newLeaseID(), SandboxID: id, Scope: scope, CreatedAt: now, Parent: a.leaseID}
	if ttl != nil {
		l.ExpiresAt = now.Add(*ttl).Truncate(time.Second)
	}
	if parent := a.expires; !parent.IsZero() {
		switch {
		case ttl == nil:
			l.ExpiresAt = parent
		case l.ExpiresAt.After(parent):
			return Ref{}, providers.InvalidFields{{Field: "ttl_s", Message: fmt.Sprintf(
				"must not outlive the calling lease, which has %d s left", int64(parent.Sub(now)/time.Second))}}
		}
	}
	if err := s.st.PutLease(ctx, l); err != nil {
		return Ref{}, err
	}
	s.mu.Lock()
	s.leases[l.ID] = l
	rec := a.box.rec
	s.mu.Unlock()
	return s.ref(rec, l), nil
}

// Release revokes the caller's own lease with every lease minted from it,
// transitively (see Revoke), and returns how many live leases the sandbox
// has left. An API key holds no lease: ErrConflict.
func (s *Service) Release(ctx context.Context, c Caller, id string) (int, error) {
	a, err := s.authorize(ctx, c, id, ScopeOperate)
	if err != nil {
		return 0, err
	}
	if a.leaseID == "" {
		return 0, providers.Errorf(providers.ErrConflict, "release revokes the calling lease token; an API key has none")
	}
	_, left, err := s.revoke(ctx, id, a.leaseID)
	return left, err
}

// Revoke ends lease leaseID of sandbox id and every lease minted from it,
// transitively (the whole subtree), durably and for every replica of a
// SharedStore, and returns how many live leases that ended. It needs
// owner scope. A lease id that is not a live lease of this sandbox (never
// minted, another sandbox's, revoked or expired) is ErrNotFound, and
// nothing changes. The caller may revoke its own lease.
func (s *Service) Revoke(ctx context.Context, c Caller, id, leaseID string) (int, error) {
	if _, err := s.authorize(ctx, c, id, ScopeOwner); err != nil {
		return 0, err
	}
	s.mu.Lock()
	l, ok := s.leases[leaseID]
	ok = ok && l.SandboxID == id && s.liveLocked(l, s.opts.Clock.Now())
	s.mu.Unlock()
	if !ok {
		return 0, providers.Errorf(providers.ErrNotFound, "sandbox %s has no live lease %s", id, leaseID)
	}
	n, _, err := s.revoke(ctx, id, leaseID)
	return n, err
}

// revoke removes lease root of sandbox id and its subtree from the store,
// then from memory. It returns how many of them were live, and how many
// live leases the sandbox has left.
func (s *Service) revoke(ctx context.Context, id, root string) (revoked, left int, err error) {
	now := s.opts.Clock.Now()
	s.mu.Lock()
	ids := s.subtreeLocked(id, root)
	for _, lid := range ids {
		if l, ok := s.leases[lid]; ok && s.liveLocked(l, now) {
			revoked++
		}
	}
	s.mu.Unlock()
	if err := s.st.DeleteLeases(ctx, id, ids); err != nil {
		return 0, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, lid := range ids {
		delete(s.leases, lid)
	}
	for _, l := range s.leases {
		if l.SandboxID == id && s.liveLocked(l, now) {
			left++
		}
	}
	return revoked, left, nil
}

// subtreeLocked returns root and every lease of sandbox id minted from
// it, transitively, root first. Caller holds mu.
func (s *Service) subtreeLocked(id, root string) []string {
	children := map[string][]string{}
	for _, l := range s.leases {
		if l.SandboxID == id && l.Parent != "" {
			children[l.Parent] = append(children[l.Parent], l.ID)
		}
	}
	out := []string{root}
	seen := map[string]bool{root: true}
	for i := 0; i < len(out); i++ {
		for _, c := range children[out[i]] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// Leases returns the live leases of sandbox id (owner scope), oldest
// first. Tokens are not kept, so none is returned.
func (s *Service) Leases(ctx context.Context, c Caller, id string) ([]Lease, error) {
	if _, err := s.authorize(ctx, c, id, ScopeOwner); err != nil {
		return nil, err
	}
	now := s.opts.Clock.Now()
	s.mu.Lock()
	var out []Lease
	for _, l := range s.leases {
		if l.SandboxID == id && s.liveLocked(l, now) {
			out = append(out, l)
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Lease) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}
