package handlers

import (
	"context"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/sandbox"
)

func snapshot(sn sandbox.Snapshot) api.Snapshot {
	return api.Snapshot{SnapshotID: sn.ID, SandboxID: sn.SandboxID, Name: sn.Name, SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt.UTC()}
}

func (s *server) CreateSnapshot(ctx context.Context, req api.CreateSnapshotRequestObject) (api.CreateSnapshotResponseObject, error) {
	var name string
	if req.Body != nil {
		name = deref(req.Body.Name)
	}
	sn, err := s.svc.Snapshot(ctx, callerFrom(ctx), req.ID, name)
	if err != nil {
		return nil, err
	}
	return api.CreateSnapshot201JSONResponse(snapshot(sn)), nil
}

func (s *server) ForkSandbox(ctx context.Context, req api.ForkSandboxRequestObject) (api.ForkSandboxResponseObject, error) {
	count := 1
	if req.Body != nil && req.Body.Count != nil {
		count = *req.Body.Count
	}
	refs, err := s.svc.Fork(ctx, callerFrom(ctx), req.ID, count)
	if err != nil {
		return nil, err
	}
	out := api.ForkSandbox201JSONResponse{Sandboxes: make([]api.SandboxRef, len(refs))}
	for i, r := range refs {
		out.Sandboxes[i] = s.ref(r)
	}
	return out, nil
}

func (s *server) ListSnapshots(ctx context.Context, req api.ListSnapshotsRequestObject) (api.ListSnapshotsResponseObject, error) {
	sns, err := s.svc.Snapshots(ctx, callerFrom(ctx))
	if err != nil {
		return nil, err
	}
	out := api.ListSnapshots200JSONResponse{Snapshots: make([]api.Snapshot, len(sns))}
	for i, sn := range sns {
		out.Snapshots[i] = snapshot(sn)
	}
	return out, nil
}

func (s *server) GetSnapshot(ctx context.Context, req api.GetSnapshotRequestObject) (api.GetSnapshotResponseObject, error) {
	sn, err := s.svc.GetSnapshot(ctx, callerFrom(ctx), req.Sid)
	if err != nil {
		return nil, err
	}
	return api.GetSnapshot200JSONResponse(snapshot(sn)), nil
}

func (s *server) DeleteSnapshot(ctx context.Context, req api.DeleteSnapshotRequestObject) (api.DeleteSnapshotResponseObject, error) {
	d, err := s.svc.DeleteSnapshot(ctx, callerFrom(ctx), req.Sid)
	if err != nil {
		return nil, err
	}
	out := api.DeleteSnapshot200JSONResponse{Deleted: d.Deleted}
	if d.Deferred {
		out.Deferred = &d.Deferred
	}
	return out, nil
}
