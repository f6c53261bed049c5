package handlers

import (
	"context"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/sandbox"
)

func (s *server) ListLeases(ctx context.Context, req api.ListLeasesRequestObject) (api.ListLeasesResponseObject, error) {
	ls, err := s.svc.Leases(ctx, callerFrom(ctx), req.ID)
	if err != nil {
		return nil, err
	}
	out := api.LeaseList{Leases: make([]api.LeaseInfo, len(ls))}
	for i, l := range ls {
		out.Leases[i] = leaseInfo(l)
	}
	return api.ListLeases200JSONResponse(out), nil
}

func leaseInfo(l sandbox.Lease) api.LeaseInfo {
	out := api.LeaseInfo{
		LeaseID:   l.ID,
		Scope:     api.LeaseScope(l.Scope),
		ParentID:  nonEmpty(l.Parent),
		CreatedAt: l.CreatedAt.UTC(),
	}
	if !l.ExpiresAt.IsZero() {
		t := l.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

func (s *server) RevokeLease(ctx context.Context, req api.RevokeLeaseRequestObject) (api.RevokeLeaseResponseObject, error) {
	n, err := s.svc.Revoke(ctx, callerFrom(ctx), req.ID, req.LeaseID)
	if err != nil {
		return nil, err
	}
	return api.RevokeLease200JSONResponse{Revoked: n}, nil
}
