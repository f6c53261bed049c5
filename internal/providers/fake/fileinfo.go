package fake

import (
	"context"
	"path"
	"slices"
	"strings"

	"github.com/sandgate/sandgate/internal/providers"
)

var _ providers.FileLister = (*Provider)(nil)

// StatFile describes a file or directory the fake holds (mode 0644 or
// 0755; no times).
func (p *Provider) StatFile(ctx context.Context, id, name string) (providers.FileInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.get(id)
	if err != nil {
		return providers.FileInfo{}, err
	}
	return b.stat(name)
}

func (b *sandbox) stat(name string) (providers.FileInfo, error) {
	base := path.Base(name)
	if data, ok := b.files[name]; ok {
		return providers.FileInfo{Name: base, Type: providers.FileRegular, Size: int64(len(data)), Mode: 0o644}, nil
	}
	if b.dirs[name] || name == "/" {
		return providers.FileInfo{Name: base, Type: providers.FileDir, Mode: 0o755}, nil
	}
	return providers.FileInfo{}, providers.Errorf(providers.ErrNotFound, "%s: no such file", name)
}

// ListDir lists what the fake holds directly under dir.
func (p *Provider) ListDir(ctx context.Context, id, dir string) ([]providers.FileInfo, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.get(id)
	if err != nil {
		return nil, false, err
	}
	fi, err := b.stat(dir)
	if err != nil {
		return nil, false, err
	}
	if fi.Type != providers.FileDir {
		return nil, false, providers.Errorf(providers.ErrInvalid, "%s is not a directory", dir)
	}
	var names []string
	for _, m := range []map[string]bool{b.dirs, keys(b.files)} {
		for n := range m {
			if parent(n) == dir && !strings.HasSuffix(n, "/") && n != dir {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	var out []providers.FileInfo
	for _, n := range slices.Compact(names) {
		fi, _ := b.stat(n)
		out = append(out, fi)
	}
	return out, false, nil
}

func keys(m map[string][]byte) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}
