package handlers

import (
	"context"

	"github.com/sandgate/sandgate/internal/api"
	"github.com/sandgate/sandgate/internal/sandbox"
)

func volume(v sandbox.VolumeInfo) api.Volume {
	by := v.MountedBy
	if by == nil {
		by = []string{}
	}
	return api.Volume{VolumeID: v.ID, Name: v.Name, SizeGib: float64(v.SizeBytes) / (1 << 30), CreatedAt: v.CreatedAt.UTC(), MountedBy: by}
}

// volumeRequests turns a create's volume mounts into the service's.
func volumeRequests(ms []api.VolumeMount) []sandbox.VolumeRequest {
	var out []sandbox.VolumeRequest
	for _, m := range ms {
		out = append(out, sandbox.VolumeRequest{Volume: deref(m.Volume), HostPath: deref(m.HostPath), MountPath: m.MountPath, ReadOnly: deref(m.ReadOnly), SubPath: deref(m.SubPath)})
	}
	return out
}

func (s *server) CreateVolume(ctx context.Context, req api.CreateVolumeRequestObject) (api.CreateVolumeResponseObject, error) {
	v, err := s.svc.CreateVolume(ctx, callerFrom(ctx), req.Body.Name, req.Body.SizeGib)
	if err != nil {
		return nil, err
	}
	return api.CreateVolume201JSONResponse(volume(sandbox.VolumeInfo{Volume: v})), nil
}

func (s *server) ListVolumes(ctx context.Context, req api.ListVolumesRequestObject) (api.ListVolumesResponseObject, error) {
	vs, err := s.svc.Volumes(ctx, callerFrom(ctx))
	if err != nil {
		return nil, err
	}
	out := api.ListVolumes200JSONResponse{Volumes: make([]api.Volume, len(vs))}
	for i, v := range vs {
		out.Volumes[i] = volume(v)
	}
	return out, nil
}

func (s *server) GetVolume(ctx context.Context, req api.GetVolumeRequestObject) (api.GetVolumeResponseObject, error) {
	v, err := s.svc.GetVolume(ctx, callerFrom(ctx), req.Volume)
	if err != nil {
		return nil, err
	}
	return api.GetVolume200JSONResponse(volume(v)), nil
}

func (s *server) DeleteVolume(ctx context.Context, req api.DeleteVolumeRequestObject) (api.DeleteVolumeResponseObject, error) {
	if err := s.svc.DeleteVolume(ctx, callerFrom(ctx), req.Volume); err != nil {
		return nil, err
	}
	return api.DeleteVolume200JSONResponse{Deleted: true}, nil
}
