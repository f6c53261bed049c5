package main

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/internal/egress/egresstest"
	"github.com/sandgate/sandgate/internal/egress/point"
)

// BenchmarkPodPoint: connection setup (connect, GET /who, close) and a
// 64 MiB download from a.test through the pod's point, against the same
// from a socket carrying the point's mark, which its rules let out as it
// is (direct). Run side by side:
//
//	go test -run '^$' -bench PodPoint -benchtime 200x ./cmd/sandgate-egress
func BenchmarkPodPoint(b *testing.B) {
	in := egresstest.Start(b)
	p := startPod(b, in)
	p.set(b, `{"policy": {"allow": ["a.test"]}}`)
	p.resolve(b, "a.test") // the point admits a.test's address once it answered it
	addr := egresstest.A.String() + ":80"
	for _, path := range []struct{ name, path string }{{"setup", "/who"}, {"64MiB", "/bytes?n=67108864"}} {
		for _, mode := range []struct {
			name   string
			marked bool
		}{{"point", false}, {"direct", true}} {
			b.Run(path.name+"/"+mode.name, func(b *testing.B) {
				if path.name == "64MiB" {
					b.SetBytes(64 << 20)
				}
				for b.Loop() {
					if _, err := fetch(p, addr, path.path, mode.marked); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// fetch dials addr from the pod (with the point's mark when marked: past
// its rules), sends GET path naming a.test and reads the whole answer.
func fetch(p *pod, addr, path string, marked bool) (int64, error) {
	var c net.Conn
	err := point.InNetns(p.ns, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		if marked {
			d.Control = func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, point.PodMark) }); err != nil {
					return err
				}
				return serr
			}
		}
		c, err = d.DialContext(context.Background(), "tcp4", addr)
		return err
	})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return egresstest.FetchOn(c, path)
}
