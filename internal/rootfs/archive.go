package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Limits on what an image tarball may hold, so a hostile one cannot make
// the index or a JSON document eat the gateway's memory.
const (
	maxArchiveEntries = 1 << 16
	maxJSONSize       = 16 << 20
	maxLinkHops       = 16
	maxIndexDepth     = 4
)

// archive is an image tarball open for reading. One pass over the tar
// indexes its entries; a file in it is then read in place, as a section of
// the tarball (ReadAt, so layers can be read concurrently).
type archive struct {
	image string // as the caller named it, for error messages
	f     *os.File
	files map[string]section // regular files by cleaned name
	links map[string]string  // symbolic and hard links by cleaned name: the cleaned name they point at
}

type section struct{ off, size int64 }

// openArchive opens and indexes the tarball at p. A compressed tarball is
// refused (ErrInvalid): layers are read in place, which needs the tar
// itself.
func openArchive(image, p string) (*archive, error) {
	// O_NONBLOCK: a FIFO swapped in after parseRef must not block the open.
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("image %s: no such file: %w", image, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("image %s: %w", image, err)
	}
	a := &archive{image: image, f: os.NewFile(uintptr(fd), p), files: map[string]section{}, links: map[string]string{}}
	if err := a.index(); err != nil {
		a.f.Close()
		return nil, err
	}
	return a, nil
}

func (a *archive) Close() error { return a.f.Close() }

func (a *archive) invalid(format string, args ...any) error {
	return fmt.Errorf("image %s: %w", a.image, invalidf(format, args...))
}

// invalidf is an ErrInvalid without the image's name, for errors of
// layers, which unpackImage names.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}

func (a *archive) index() error {
	fi, err := a.f.Stat()
	if err != nil {
		return fmt.Errorf("image %s: %w", a.image, err)
	}
	if !fi.Mode().IsRegular() {
		return a.invalid("not a regular file")
	}
	magic := make([]byte, 6)
	n, _ := a.f.ReadAt(magic, 0)
	if c := compressionOf(magic[:n]); c != "" {
		return a.invalid("a %s-compressed tarball; decompress it first", c)
	}
	// tar.Reader reads the file directly (no read-ahead) and skips entry
	// data by seeking, so after Next the file offset is where the entry's
	// data starts.
	tr := tar.NewReader(a.f)
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return a.invalid("not a tar archive (%v)", err)
		}
		if i >= maxArchiveEntries {
			return a.invalid("more than %d entries", maxArchiveEntries)
		}
		name := cleanRel(hdr.Name)
		switch hdr.Typeflag {
		case tar.TypeReg:
			if isSparse(hdr) {
				continue // never an image file; its data is not stored in place
			}
			off, err := a.f.Seek(0, io.SeekCurrent)
			if err != nil {
				return fmt.Errorf("image %s: %w", a.image, err)
			}
			a.files[name] = section{off, hdr.Size}
		case tar.TypeSymlink:
			// docker save links a layer.tar it has already written.
			target := hdr.Linkname
			if !path.IsAbs(target) {
				target = path.Join(path.Dir(name), target)
			}
			a.links[name] = cleanRel(target)
		case tar.TypeLink:
			a.links[name] = cleanRel(hdr.Linkname)
		}
	}
}

func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// compressionOf names the compression format b starts with, or "".
func compressionOf(b []byte) string {
	switch {
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
		return "gzip"
	case bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return "zstd"
	case bytes.HasPrefix(b, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return "xz"
	case bytes.HasPrefix(b, []byte("BZh")):
		return "bzip2"
	}
	return ""
}

// cleanRel makes a tar entry name relative to the archive's root: "/a",
// "./a", "../a" and "a/b/../../a" all become "a"; the root itself is ".".
func cleanRel(name string) string {
	p := path.Clean("/" + name)[1:]
	if p == "" {
		return "."
	}
	return p
}

// lookup finds the regular file name, following links in the archive.
func (a *archive) lookup(name string) (section, bool) {
	for range maxLinkHops {
		if s, ok := a.files[name]; ok {
			return s, true
		}
		target, ok := a.links[name]
		if !ok {
			return section{}, false
		}
		name = target
	}
	return section{}, false
}

// open returns a reader of the regular file name, or ok false if the
// archive has none.
func (a *archive) open(name string) (r *io.SectionReader, ok bool) {
	s, ok := a.lookup(name)
	if !ok {
		return nil, false
	}
	return io.NewSectionReader(a.f, s.off, s.size), true
}

// readSmall reads the whole file name (a JSON document), or ok false if the
// archive has none.
func (a *archive) readSmall(name string) (b []byte, ok bool, err error) {
	s, ok := a.lookup(name)
	if !ok {
		return nil, false, nil
	}
	if s.size > maxJSONSize {
		return nil, true, a.invalid("%s is larger than %d bytes", name, maxJSONSize)
	}
	b = make([]byte, s.size)
	if _, err := a.f.ReadAt(b, s.off); err != nil {
		return nil, true, fmt.Errorf("image %s: read %s: %w", a.image, name, err)
	}
	return b, true, nil
}

func blobName(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// readBlob reads the OCI layout blob h and checks its digest.
func (a *archive) readBlob(h v1.Hash) (b []byte, ok bool, err error) {
	if h.Algorithm != "sha256" {
		return nil, false, a.invalid("digest algorithm %s is not supported", h.Algorithm)
	}
	b, ok, err = a.readSmall(blobName(h))
	if !ok || err != nil {
		return nil, ok, err
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != h.Hex {
		return nil, true, a.invalid("blob %s does not match its digest", h)
	}
	return b, true, nil
}

// candidate is one image a tarball holds.
type candidate struct {
	names    []string // references it is tagged with, as written in the tarball
	manifest v1.Hash  // OCI: the manifest's digest; docker save: zero
	config   []byte
	digest   v1.Hash  // of config
	layers   []string // archive names of the layer blobs, bottom first
}

func (c *candidate) String() string {
	if len(c.names) > 0 {
		return strings.Join(c.names, " ")
	}
	return c.digest.String()
}

// candidates lists the images in the tarball: from manifest.json if it has
// one (docker save; Docker 25+ writes an OCI layout beside it), else from
// an OCI layout's index.json. An image listed twice appears once, with the
// names of both.
func (a *archive) candidates() ([]*candidate, error) {
	var cs []*candidate
	var err error
	if _, ok := a.lookup("manifest.json"); ok {
		cs, err = a.dockerCandidates()
	} else if _, ok := a.lookup("index.json"); ok {
		if _, ok := a.lookup("oci-layout"); !ok {
			return nil, a.invalid("index.json but no oci-layout: not an OCI image layout")
		}
		cs, err = a.ociCandidates()
	} else {
		return nil, a.invalid("neither docker save output (manifest.json) nor an OCI image layout (oci-layout, index.json)")
	}
	if err != nil {
		return nil, err
	}
	var out []*candidate
	byDigest := map[v1.Hash]*candidate{}
	for _, c := range cs {
		if prev, ok := byDigest[c.digest]; ok {
			for _, n := range c.names {
				if !containsString(prev.names, n) {
					prev.names = append(prev.names, n)
				}
			}
			continue
		}
		byDigest[c.digest] = c
		out = append(out, c)
	}
	return out, nil
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func (a *archive) dockerCandidates() ([]*candidate, error) {
	raw, _, err := a.readSmall("manifest.json")
	if err != nil {
		return nil, err
	}
	var m []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, a.invalid("manifest.json: %v", err)
	}
	var cs []*candidate
	for _, e := range m {
		config, ok, err := a.readSmall(cleanRel(e.Config))
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, a.invalid("config %s is not in the tarball", e.Config)
		}
		sum := sha256.Sum256(config)
		c := &candidate{names: e.RepoTags, config: config, digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}}
		for _, l := range e.Layers {
			c.layers = append(c.layers, cleanRel(l))
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// OCI annotations that name an image in a layout's index.json.
const (
	annotationRefName       = "org.opencontainers.image.ref.name" // a tag, or a whole reference
	annotationContainerName = "io.containerd.image.name"          // a whole reference (docker save, containerd)
)

func (a *archive) ociCandidates() ([]*candidate, error) {
	raw, _, err := a.readSmall("index.json")
	if err != nil {
		return nil, err
	}
	idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, a.invalid("index.json: %v", err)
	}
	var cs []*candidate
	for _, d := range idx.Manifests {
		var names []string
		for _, k := range []string{annotationContainerName, annotationRefName} {
			if n := d.Annotations[k]; n != "" && !containsString(names, n) {
				names = append(names, n)
			}
		}
		if err := a.ociWalk(d, names, 0, &cs); err != nil {
			return nil, err
		}
	}
	return cs, nil
}

// ociWalk adds the image d describes, or the images for this platform of
// the index d describes, to cs. Blobs of other platforms may be missing
// (a single-platform save of a multi-platform image): a missing manifest
// below the top level is skipped.
func (a *archive) ociWalk(d v1.Descriptor, names []string, depth int, cs *[]*candidate) error {
	if depth > maxIndexDepth {
		return a.invalid("image indexes nested deeper than %d", maxIndexDepth)
	}
	raw, ok, err := a.readBlob(d.Digest)
	if err != nil {
		return err
	}
	if !ok {
		if depth > 0 {
			return nil
		}
		return a.invalid("manifest %s is not in the tarball", d.Digest)
	}
	mt := d.MediaType
	if mt == "" {
		var probe struct {
			MediaType types.MediaType `json:"mediaType"`
			Manifests json.RawMessage `json:"manifests"`
		}
		if err := json.Unmarshal(raw, &probe); err != nil {
			return a.invalid("manifest %s: %v", d.Digest, err)
		}
		mt = probe.MediaType
		if mt == "" && probe.Manifests != nil {
			mt = types.OCIImageIndex
		} else if mt == "" {
			mt = types.OCIManifestSchema1
		}
	}
	switch {
	case mt.IsIndex():
		idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return a.invalid("index %s: %v", d.Digest, err)
		}
		for _, c := range idx.Manifests {
			if p := c.Platform; p != nil && (p.OS != "linux" || p.Architecture != runtime.GOARCH) {
				continue // another platform, or an attestation (unknown/unknown)
			}
			if err := a.ociWalk(c, names, depth+1, cs); err != nil {
				return err
			}
		}
		return nil
	case mt.IsImage():
		m, err := v1.ParseManifest(bytes.NewReader(raw))
		if err != nil {
			return a.invalid("manifest %s: %v", d.Digest, err)
		}
		config, ok, err := a.readBlob(m.Config.Digest)
		if err != nil {
			return err
		}
		if !ok {
			return a.invalid("config %s is not in the tarball", m.Config.Digest)
		}
		c := &candidate{names: names, manifest: d.Digest, config: config, digest: m.Config.Digest}
		for _, l := range m.Layers {
			c.layers = append(c.layers, blobName(l.Digest))
		}
		*cs = append(*cs, c)
		return nil
	}
	return nil // an artifact, not an image
}

// matchesTag reports whether an image tagged n is what sel names: the same
// string, or the same reference once both are normalised ("busybox:1" is
// "docker.io/library/busybox:1").
func matchesTag(n, sel string) bool {
	if n == sel {
		return true
	}
	rn, err1 := name.ParseReference(n)
	rs, err2 := name.ParseReference(sel)
	return err1 == nil && err2 == nil && rn.Name() == rs.Name()
}

// tarImage is the image selected in an archive. It is a
// partial.UncompressedImageCore whose layers check their content against
// the config's diff_ids as they are read; since the config is checked
// against its digest, the digest names the whole content.
type tarImage struct {
	a      *archive
	c      *candidate
	digest v1.Hash
	config *v1.ConfigFile
}

// selectImage selects the image r names in the archive (see parseRef) and
// checks that it can run here.
func (a *archive) selectImage(r ref) (*tarImage, error) {
	cs, err := a.candidates()
	if err != nil {
		return nil, err
	}
	var pick []*candidate
	for _, c := range cs {
		switch {
		case r.tag != "":
			for _, n := range c.names {
				if matchesTag(n, r.tag) {
					pick = append(pick, c)
					break
				}
			}
		case r.digest != "":
			if c.digest.String() == r.digest || c.manifest.String() == r.digest {
				pick = append(pick, c)
			}
		default:
			pick = append(pick, c)
		}
	}
	held := make([]string, len(cs))
	for i, c := range cs {
		held[i] = c.String()
	}
	switch {
	case len(cs) == 0:
		return nil, a.invalid("the tarball holds no image for linux/%s", runtime.GOARCH)
	case len(pick) == 0:
		return nil, fmt.Errorf("image %s: not in the tarball, which holds: %s: %w", a.image, strings.Join(held, ", "), ErrNotFound)
	case len(pick) > 1:
		return nil, a.invalid("the tarball holds %d images (%s); name one as <path>:<repo>:<tag> or <path>@sha256:<digest>", len(pick), strings.Join(held, ", "))
	}
	c := pick[0]
	cfg, err := v1.ParseConfigFile(bytes.NewReader(c.config))
	if err != nil {
		return nil, a.invalid("config: %v", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, a.invalid("the image is for %s, not linux", cfg.OS)
	}
	if cfg.Architecture != "" && cfg.Architecture != runtime.GOARCH {
		return nil, a.invalid("the image is for linux/%s; this host runs linux/%s", cfg.Architecture, runtime.GOARCH)
	}
	if n := len(cfg.RootFS.DiffIDs); n != len(c.layers) {
		return nil, a.invalid("the config lists %d layers, the manifest %d", n, len(c.layers))
	}
	for _, d := range cfg.RootFS.DiffIDs {
		if d.Algorithm != "sha256" {
			return nil, a.invalid("diff_id algorithm %s is not supported", d.Algorithm)
		}
	}
	return &tarImage{a: a, c: c, digest: c.digest, config: cfg}, nil
}

var _ partial.UncompressedImageCore = (*tarImage)(nil)

func (t *tarImage) RawConfigFile() ([]byte, error) { return t.c.config, nil }

func (t *tarImage) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

func (t *tarImage) LayerByDiffID(h v1.Hash) (partial.UncompressedLayer, error) {
	for i, d := range t.config.RootFS.DiffIDs {
		if d == h {
			return &tarLayer{a: t.a, name: t.c.layers[i], diffID: h}, nil
		}
	}
	return nil, invalidf("no layer with diff_id %s", h)
}

// tarLayer is one layer blob in the archive, gzip- or zstd-compressed or
// not (told by its first bytes, not its media type).
type tarLayer struct {
	a      *archive
	name   string
	diffID v1.Hash
}

func (l *tarLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }

func (l *tarLayer) MediaType() (types.MediaType, error) { return types.OCIUncompressedLayer, nil }

// Uncompressed returns the layer's tar stream. Its Read fails with
// ErrInvalid on corrupt compressed data and, at the end, if the content
// does not hash to the diff_id.
func (l *tarLayer) Uncompressed() (io.ReadCloser, error) {
	sr, ok := l.a.open(l.name)
	if !ok {
		return nil, invalidf("layer %s is not in the tarball", l.name)
	}
	head := make([]byte, 6)
	n, _ := sr.ReadAt(head, 0)
	lr := &layerReader{l: l, h: sha256.New()}
	switch c := compressionOf(head[:n]); c {
	case "gzip":
		zr, err := gzip.NewReader(sr)
		if err != nil {
			return nil, invalidf("layer %s: %v", l.name, err)
		}
		lr.r, lr.close = zr, zr.Close
	case "zstd":
		// One decoder goroutine-free: concurrency 1 decodes in the caller.
		zr, err := zstd.NewReader(sr, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, invalidf("layer %s: %v", l.name, err)
		}
		lr.r, lr.close = zr, func() error { zr.Close(); return nil }
	case "":
		lr.r, lr.close = sr, func() error { return nil }
	default:
		return nil, invalidf("layer %s is %s-compressed, which is not supported", l.name, c)
	}
	return lr, nil
}

// layerReader decompresses a layer and checks its diff_id at EOF.
type layerReader struct {
	l     *tarLayer
	r     io.Reader
	close func() error
	h     hash.Hash
}

func (r *layerReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	switch {
	case err == io.EOF:
		if hex.EncodeToString(r.h.Sum(nil)) != r.l.diffID.Hex {
			return n, invalidf("layer %s does not match its diff_id %s", r.l.name, r.l.diffID)
		}
	case err != nil:
		return n, invalidf("layer %s: %v", r.l.name, err)
	}
	return n, err
}

func (r *layerReader) Close() error { return r.close() }
