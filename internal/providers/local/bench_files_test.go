package local

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/sandgate/sandgate/internal/providers"
)

// BenchmarkFiles streams 32 MiB into a sandbox file and back out through
// the provider (the descriptor the agent passes), and stats a file: the
// data plane of the file routes without HTTP.
func BenchmarkFiles(b *testing.B) {
	l := newLocal(b, Options{})
	id := create(b, l, providers.CreateSpec{})
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 2<<20)
	b.Run("write", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := l.WriteFile(ctx, id, "/workspace/big", bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			r, _, err := l.ReadFile(ctx, id, "/workspace/big")
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, r)
			r.Close()
			if err != nil || n != int64(len(data)) {
				b.Fatal(err, n)
			}
		}
	})
	b.Run("stat", func(b *testing.B) {
		for b.Loop() {
			if _, err := l.StatFile(ctx, id, "/workspace/big"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
