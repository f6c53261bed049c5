package providers

import "context"

// Image is one image a create may name.
type Image struct {
	Name      string // what a create gives as image
	Source    string // ImageSourceDirectory or ImageSourceDocker
	SizeBytes int64  // 0: unknown
}

// Image sources.
const (
	ImageSourceDirectory = "directory" // the local provider's image directory
	ImageSourceDocker    = "docker"    // a docker daemon's store
)

// ImageLister is implemented by providers that can list the images they
// run without pulling. Without it, the list is empty and incomplete.
type ImageLister interface {
	Images(ctx context.Context) ([]Image, error)
}
