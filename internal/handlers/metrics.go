package handlers

import (
	"context"
	"time"

	"github.com/sandgate/sandgate/internal/api"
)

func (s *server) GetSandboxMetrics(ctx context.Context, req api.GetSandboxMetricsRequestObject) (api.GetSandboxMetricsResponseObject, error) {
	var start, end time.Time
	if req.Params.Start != nil {
		start = *req.Params.Start
	}
	if req.Params.End != nil {
		end = *req.Params.End
	}
	ms, err := s.svc.Metrics(ctx, callerFrom(ctx), req.ID, start, end)
	if err != nil {
		return nil, err
	}
	out := api.GetSandboxMetrics200JSONResponse{Samples: make([]api.MetricSample, len(ms))}
	for i, m := range ms {
		out.Samples[i] = api.MetricSample{Time: m.Time, CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
			MemUsed: m.MemUsed, MemCache: m.MemCache, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
	}
	return out, nil
}
