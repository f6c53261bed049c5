package handlers

import (
	"context"

	"github.com/sandgate/sandgate/internal/api"
)

func (s *server) ListImages(ctx context.Context, _ api.ListImagesRequestObject) (api.ListImagesResponseObject, error) {
	il, err := s.svc.Images(ctx, callerFrom(ctx))
	if err != nil {
		return nil, err
	}
	out := api.ListImages200JSONResponse{ProviderName: s.svc.ProviderName(), Images: make([]api.ImageInfo, len(il.Images)), Complete: il.Complete}
	for i, im := range il.Images {
		out.Images[i] = api.ImageInfo{Name: im.Name, Source: api.ImageInfoSource(im.Source)}
		if im.SizeBytes > 0 {
			out.Images[i].SizeBytes = &im.SizeBytes
		}
	}
	if il.Note != "" {
		out.Note = &il.Note
	}
	return out, nil
}
