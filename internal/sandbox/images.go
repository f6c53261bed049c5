package sandbox

import (
	"context"

	"github.com/sandgate/sandgate/internal/providers"
)

// ImageList is what a create may name in image.
type ImageList struct {
	Images   []providers.Image
	Complete bool   // false: the provider runs images it cannot list
	Note     string // why not complete
}

// Images lists the images the provider runs without pulling (any API
// key; anonymous where creates are).
func (s *Service) Images(ctx context.Context, c Caller) (ImageList, error) {
	if _, err := s.authorizeKey(c); err != nil {
		return ImageList{}, err
	}
	il, ok := s.p.(providers.ImageLister)
	if !ok {
		return ImageList{Images: []providers.Image{}, Note: "provider " + s.p.Name() + " runs any image its hosts can pull, which it cannot list"}, nil
	}
	images, err := il.Images(ctx)
	if err != nil {
		return ImageList{}, err
	}
	if images == nil {
		images = []providers.Image{}
	}
	return ImageList{Images: images, Complete: true}, nil
}
